// Package helm provides the pinned helm binary and the chart paths to tests
// and tools: the chart tests in this directory, and the end-to-end tests
// that install the chart into the local cluster.
//
// Helm is built from the Go module proxy (no other download is possible on
// the machines this project runs on) and cached under
// ${TESSERA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}/bin/helm-<version>/helm.
package helm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/tessera-dev/tessera/test/cachedir"
)

// Version is the helm release used everywhere in this repository. Keep it
// equal to HELM_VERSION in deployments/helm/helm.mk (a test checks).
const Version = "v4.3.1"

// Module is helm's Go module at Version's major version.
const Module = "helm.sh/helm/v4"

// Paths inside the repository, names and the local cluster's image.
const (
	ChartPath          = "deployments/helm/tessera"
	MockValuesPath     = "deployments/helm/values/mock.yaml"
	LocalClusterValues = "deployments/helm/values/localcluster.yaml"
	ReleaseName        = "tessera"
	DefaultNamespace   = "tessera-system"
	// LocalClusterImage is what `go run ./hack/image` builds and
	// LocalClusterValues deploys (imagePullPolicy Never).
	LocalClusterImage = "tessera.dev/tessera:dev"
)

// LocalClusterInstallArgs are the helm arguments (after the binary) that
// install or upgrade the chart into the local cluster with mock GPUs:
// kubeconfig is the cluster's, mockDeviceRoot the harness's fake device
// directory, profile a --mock-profile value ("" keeps the values file's),
// extra more flags such as "--set", "kubeletPlugin.timeSlices=4".
func LocalClusterInstallArgs(repoRoot, kubeconfig, mockDeviceRoot, profile string, extra ...string) []string {
	args := []string{"upgrade", "--install", ReleaseName, filepath.Join(repoRoot, ChartPath),
		"--kubeconfig", kubeconfig,
		"--namespace", DefaultNamespace, "--create-namespace",
		"--values", filepath.Join(repoRoot, LocalClusterValues),
		"--set-string", "kubeletPlugin.mock.deviceRoot=" + mockDeviceRoot,
		"--wait", "--timeout", "3m",
	}
	if profile != "" {
		args = append(args, "--set-string", "kubeletPlugin.mock.profile="+profile)
	}
	return append(args, extra...)
}

// CacheDir is ${TESSERA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera},
// the same cache the local-cluster harness uses.
func CacheDir() string { return cachedir.Dir() }

// BinaryPath is where the pinned helm is cached.
func BinaryPath() string {
	return filepath.Join(CacheDir(), "bin", "helm-"+Version, "helm")
}

// Binary returns the path of a usable helm: $HELM when set, else the cached
// pinned build, building it first when it is missing (go install from the
// module proxy; a few minutes on a cold Go cache). logf reports progress
// and may be nil.
func Binary(ctx context.Context, logf func(string, ...any)) (string, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if h := os.Getenv("HELM"); h != "" {
		if _, err := os.Stat(h); err != nil {
			return "", fmt.Errorf("$HELM=%s: %w", h, err)
		}
		return h, nil
	}
	dst := BinaryPath()
	if fi, err := os.Stat(dst); err == nil && fi.Mode()&0o111 != 0 {
		return dst, nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", err
	}
	// Build into a private directory, then rename: concurrent builders never
	// see a half-written binary.
	tmp, err := os.MkdirTemp(filepath.Dir(dst), ".build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	logf("building helm %s from the Go module proxy into %s (once; a few minutes on a cold cache)", Version, dst)
	cmd := exec.CommandContext(ctx, goBinary(), "install",
		"-trimpath",
		"-ldflags", "-s -w -X "+Module+"/internal/version.version="+Version,
		Module+"/cmd/helm@"+Version)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false", "GOWORK=off")
	cmd.Dir = tmp // outside any module: go install pkg@version uses helm's own go.mod
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go install %s/cmd/helm@%s: %w\n%s", Module, Version, err, tail(out, 2000))
	}
	if err := os.Rename(filepath.Join(tmp, "helm"), dst); err != nil {
		return "", err
	}
	return dst, nil
}

func goBinary() string {
	if g := os.Getenv("GO"); g != "" {
		return g
	}
	if root := os.Getenv("GOROOT"); root != "" {
		if p := filepath.Join(root, "bin", "go"); fileExists(p) {
			return p
		}
	}
	return "go"
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
