// Package apiserver starts a private etcd and kube-apiserver for tests
// (controller-runtime's envtest): no kubelet, scheduler or controllers, so
// objects are stored and admitted but nothing runs. The binaries are the
// ones the local-cluster harness builds (make cluster-build), never
// downloaded.
package apiserver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/tessera-dev/tessera/test/cachedir"
)

// ErrNoBinaries is returned when kube-apiserver, etcd or kubectl is
// missing; the error names where they were looked for.
var ErrNoBinaries = errors.New("no kube-apiserver, etcd and kubectl built")

// Options configure the API server.
type Options struct {
	// CRDDirs are installed before Start returns.
	CRDDirs []string
	// Flags are extra kube-apiserver flags (name without dashes → value).
	Flags map[string]string
}

// Server is a running etcd and kube-apiserver, stopped when the test ends.
type Server struct {
	// Config is an admin (system:masters) client configuration.
	Config *rest.Config
	// Kubeconfig is a kubeconfig file of the same admin, for tools.
	Kubeconfig string
}

// Start starts etcd and kube-apiserver on free loopback ports. It returns
// an error wrapping ErrNoBinaries when the binaries are not built.
func Start(t testing.TB, opts Options) (*Server, error) {
	t.Helper()
	dir, err := assets(t.TempDir())
	if err != nil {
		return nil, err
	}
	te := &envtest.Environment{
		BinaryAssetsDirectory:    dir,
		CRDDirectoryPaths:        opts.CRDDirs,
		ErrorIfCRDPathMissing:    len(opts.CRDDirs) > 0,
		ControlPlaneStartTimeout: 90 * time.Second, // a loaded shared machine
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	args := te.ControlPlane.GetAPIServer().Configure()
	for name, value := range opts.Flags {
		args.Set(name, value)
	}
	cfg, err := te.Start()
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver and etcd: %w", err)
	}
	t.Cleanup(func() { _ = te.Stop() })
	admin, err := te.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, err
	}
	kc, err := admin.KubeConfig()
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		return nil, err
	}
	return &Server{Config: cfg, Kubeconfig: kubeconfig}, nil
}

// assets returns a directory (made in dir) holding kube-apiserver, etcd
// and kubectl: $KUBEBUILDER_ASSETS when set, else links to the newest ones
// the local-cluster harness built into <cache>/bin/{kubernetes-v*,etcd-v*}.
func assets(dir string) (string, error) {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d, nil
	}
	bin := filepath.Join(cachedir.Dir(), "bin")
	for name, component := range map[string]string{"kube-apiserver": "kubernetes", "kubectl": "kubernetes", "etcd": "etcd"} {
		path := newest(filepath.Join(bin, component+"-v*", name))
		if path == "" {
			return "", fmt.Errorf("%w: %s is not under %s/%s-v*: run `make cluster-build` or set KUBEBUILDER_ASSETS", ErrNoBinaries, name, bin, component)
		}
		if err := os.Symlink(path, filepath.Join(dir, name)); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// newest is the last match of pattern in version order.
func newest(pattern string) string {
	m, _ := filepath.Glob(pattern)
	sort.Strings(m)
	if len(m) == 0 {
		return ""
	}
	return m[len(m)-1]
}
