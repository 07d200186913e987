package localcluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/tessera-dev/tessera/test/cachedir"
)

// Binaries are the absolute paths of every program the local cluster runs.
type Binaries struct {
	KubeAPIServer         string
	KubeControllerManager string
	KubeScheduler         string
	Kubelet               string
	Kubectl               string
	Etcd                  string
	Containerd            string
	Ctr                   string
	ContainerdShim        string
	Runc                  string
	CNILoopback           string
	Busybox               string
	// Kwok is the kwok controller; KwokStages its default Stages (node
	// initialisation and heartbeat with leases, pod ready, complete and
	// delete), copied from the same module version.
	Kwok       string
	KwokStages string
}

// CacheDir is where built binaries and the throwaway build modules live:
// ${XDG_CACHE_HOME:-$HOME/.cache}/tessera. TESSERA_CACHE_DIR overrides it.
func CacheDir() string { return cachedir.Dir() }

// binDir is the cache directory of one component at one version.
func binDir(component, version string) string {
	return filepath.Join(CacheDir(), "bin", component+"-"+version)
}

// buildDir is the throwaway Go module used to build one component.
func buildDir(component, version string) string {
	return filepath.Join(CacheDir(), "build", component+"-"+version)
}

// Logf is how the harness reports progress.
type Logf func(format string, args ...any)

// EnsureBinaries installs missing Debian packages and builds every component
// of the cluster that is not already cached for its pinned version. It is cheap when
// everything is cached.
func EnsureBinaries(ctx context.Context, logf Logf) (*Binaries, error) {
	if err := EnsureHostPackages(ctx, logf); err != nil {
		return nil, err
	}
	b := binaryPaths()
	k8s, etcd, ctrd := filepath.Dir(b.Kubectl), filepath.Dir(b.Etcd), filepath.Dir(b.Containerd)
	if err := buildKubernetes(ctx, logf, k8s); err != nil {
		return nil, fmt.Errorf("building kubernetes %s: %w", KubernetesVersion, err)
	}
	if err := buildEtcd(ctx, logf, etcd); err != nil {
		return nil, fmt.Errorf("building etcd %s: %w", EtcdVersion, err)
	}
	if err := buildContainerd(ctx, logf, ctrd); err != nil {
		return nil, fmt.Errorf("building containerd %s: %w", ContainerdVersion, err)
	}
	// KWOK and Kueue are built by StartKwok and StartKueue, the first
	// time a scale run needs them: the demo and the end-to-end tests do
	// not.
	return b, nil
}

// EnsureEtcd builds only etcd (EtcdVersion) when it is not cached and returns
// the path of its binary, for harnesses that need etcd without the cluster
// (kube-scheduler's scheduler_perf, make bench-upstream).
func EnsureEtcd(ctx context.Context, logf Logf) (string, error) {
	etcd := binaryPaths().Etcd
	if err := buildEtcd(ctx, logf, filepath.Dir(etcd)); err != nil {
		return "", fmt.Errorf("building etcd %s: %w", EtcdVersion, err)
	}
	return etcd, nil
}

// binaryPaths says where every program is, built or not.
func binaryPaths() *Binaries {
	k8s := binDir("kubernetes", KubernetesVersion)
	etcd := binDir("etcd", EtcdVersion)
	ctrd := binDir("containerd", ContainerdVersion)
	kwok := binDir("kwok", KwokVersion)
	return &Binaries{
		KubeAPIServer:         filepath.Join(k8s, "kube-apiserver"),
		KubeControllerManager: filepath.Join(k8s, "kube-controller-manager"),
		KubeScheduler:         filepath.Join(k8s, "kube-scheduler"),
		Kubelet:               filepath.Join(k8s, "kubelet"),
		Kubectl:               filepath.Join(k8s, "kubectl"),
		Etcd:                  filepath.Join(etcd, "etcd"),
		Containerd:            filepath.Join(ctrd, "containerd"),
		Ctr:                   filepath.Join(ctrd, "ctr"),
		ContainerdShim:        filepath.Join(ctrd, "containerd-shim-runc-v2"),
		Runc:                  "/usr/sbin/runc",
		CNILoopback:           "/usr/lib/cni/loopback",
		Busybox:               "/bin/busybox",
		Kwok:                  filepath.Join(kwok, "kwok"),
		KwokStages:            filepath.Join(kwok, kwokStagesFile),
	}
}

// EnsureHostPackages installs the Debian packages in HostPackages that are
// missing, running apt-get update first.
func EnsureHostPackages(ctx context.Context, logf Logf) error {
	var missing []string
	for _, p := range HostPackages {
		if _, err := os.Stat(p.File); err != nil {
			missing = append(missing, p.Name)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("Debian packages %v are missing and only root can install them", missing)
	}
	logf("installing Debian packages %v (apt-get update first)", missing)
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	for _, args := range [][]string{
		{"apt-get", "update"},
		append([]string{"apt-get", "install", "-y", "--no-install-recommends"}, missing...),
	} {
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w\n%s", strings.Join(args, " "), err, tail(string(out), 20))
		}
	}
	return nil
}

var kubernetesCommands = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"}

func buildKubernetes(ctx context.Context, logf Logf, dst string) error {
	return buildOnce(ctx, logf, "kubernetes", KubernetesVersion, dst, kubernetesCommands,
		"cold build takes 15-20 minutes on 2 cores, later builds use the Go build cache",
		func(work, out string, run runFunc) error {
			goMod := fmt.Sprintf("module tessera.local/build/kubernetes\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes %s\n", KubernetesVersion)
			if err := os.WriteFile(filepath.Join(work, "go.mod"), []byte(goMod), 0o644); err != nil {
				return err
			}
			// kubernetes' own go.mod replaces every staging module with a
			// directory; a consumer must pin them to the published versions.
			staging, err := stagingModules(ctx, work)
			if err != nil {
				return err
			}
			var sb strings.Builder
			sb.WriteString(goMod)
			for _, m := range staging {
				fmt.Fprintf(&sb, "replace %s => %s %s\n", m, m, KubernetesStagingVersion)
			}
			if err := os.WriteFile(filepath.Join(work, "go.mod"), []byte(sb.String()), 0o644); err != nil {
				return err
			}
			var pkgs []string
			for _, c := range kubernetesCommands {
				pkgs = append(pkgs, "k8s.io/kubernetes/cmd/"+c)
			}
			if err := writeToolsFile(work, pkgs); err != nil {
				return err
			}
			if err := run("go", "mod", "tidy"); err != nil {
				return err
			}
			var ld []string
			for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
				ld = append(ld,
					"-X", pkg+".gitVersion="+KubernetesVersion,
					"-X", pkg+".gitMajor="+major(KubernetesVersion),
					"-X", pkg+".gitMinor="+minor(KubernetesVersion),
					"-X", pkg+".gitTreeState=clean",
				)
			}
			args := append([]string{"build", "-trimpath", "-ldflags", "-s -w " + strings.Join(ld, " "), "-o", out + "/"}, pkgs...)
			return run("go", args...)
		})
}

func buildEtcd(ctx context.Context, logf Logf, dst string) error {
	return buildOnce(ctx, logf, "etcd", EtcdVersion, dst, []string{"etcd"}, "about 1 minute cold",
		func(work, out string, run runFunc) error {
			goMod := fmt.Sprintf("module tessera.local/build/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n", EtcdVersion)
			if err := os.WriteFile(filepath.Join(work, "go.mod"), []byte(goMod), 0o644); err != nil {
				return err
			}
			if err := writeToolsFile(work, []string{"go.etcd.io/etcd/server/v3"}); err != nil {
				return err
			}
			if err := run("go", "mod", "tidy"); err != nil {
				return err
			}
			return run("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(out, "etcd"), "go.etcd.io/etcd/server/v3")
		})
}

var containerdCommands = []string{"containerd", "ctr", "containerd-shim-runc-v2"}

func buildContainerd(ctx context.Context, logf Logf, dst string) error {
	return buildOnce(ctx, logf, "containerd", ContainerdVersion, dst, containerdCommands, "about 3 minutes cold",
		func(work, out string, run runFunc) error {
			ld := "-s -w -X github.com/containerd/containerd/v2/version.Version=" + ContainerdVersion
			for _, c := range containerdCommands {
				pkg := "github.com/containerd/containerd/v2/cmd/" + c + "@" + ContainerdVersion
				if err := run("env", "GOBIN="+out, "CGO_ENABLED=0", "go", "install", "-trimpath", "-ldflags", ld, pkg); err != nil {
					return err
				}
			}
			return nil
		})
}

type runFunc func(name string, args ...string) error

// buildOnce builds a component into dst unless dst already holds every
// expected program. The build happens in a temporary output directory that is
// renamed into place, so an interrupted build never leaves a half-filled cache
// entry. A file lock serialises concurrent harness runs.
func buildOnce(ctx context.Context, logf Logf, component, version, dst string, programs []string, hint string,
	build func(work, out string, run runFunc) error) error {
	complete := func() bool {
		for _, p := range programs {
			if fi, err := os.Stat(filepath.Join(dst, p)); err != nil || fi.Mode()&0o111 == 0 {
				return false
			}
		}
		return true
	}
	if complete() {
		return nil
	}
	work := buildDir(component, version)
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	unlock, err := lockFile(filepath.Join(work, ".lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if complete() { // built by a concurrent run while we waited
		return nil
	}
	out := dst + ".tmp"
	_ = os.RemoveAll(out)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	logPath := filepath.Join(work, "build.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()

	start := time.Now()
	logf("building %s %s into %s (%s; log: %s)", component, version, dst, hint, logPath)
	stop := progress(30*time.Second, func(elapsed time.Duration) {
		logf("  still building %s %s (%s elapsed)", component, version, elapsed.Round(time.Second))
	})
	run := func(name string, args ...string) error {
		fmt.Fprintf(logFile, "+ %s %s\n", name, strings.Join(args, " "))
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-buildvcs=false")
		cmd.Stdout = logFile
		cmd.Stderr = logFile
		if err := cmd.Run(); err != nil {
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, tail(string(b), 30))
		}
		return nil
	}
	err = build(work, out, run)
	stop()
	if err != nil {
		return err
	}
	_ = os.RemoveAll(dst)
	if err := os.Rename(out, dst); err != nil {
		return err
	}
	if !complete() {
		return fmt.Errorf("build finished but %s lacks some of %v", dst, programs)
	}
	logf("built %s %s in %s", component, version, time.Since(start).Round(time.Second))
	return nil
}

// stagingModules lists the modules that k8s.io/kubernetes replaces with its
// ./staging directories.
func stagingModules(ctx context.Context, work string) ([]string, error) {
	info, err := downloadModule(ctx, work, "k8s.io/kubernetes@"+KubernetesVersion)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(info.GoMod)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	re := regexp.MustCompile(`^\s*(?:replace\s+)?(k8s\.io/\S+)\s+=>\s+\./staging/`)
	var mods []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			mods = append(mods, m[1])
		}
	}
	if len(mods) == 0 {
		return nil, fmt.Errorf("no staging replaces found in %s", info.GoMod)
	}
	return mods, sc.Err()
}

// moduleInfo is what `go mod download -json` says of a module version.
type moduleInfo struct{ Dir, GoMod, Error string }

// downloadModule downloads a module version into the module cache.
func downloadModule(ctx context.Context, work, modVersion string) (*moduleInfo, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", modVersion)
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go mod download %s: %w", modVersion, err)
	}
	var info moduleInfo
	if err := json.Unmarshal(out, &info); err != nil {
		return nil, err
	}
	if info.Error != "" {
		return nil, errors.New(info.Error)
	}
	return &info, nil
}

func writeToolsFile(dir string, pkgs []string) error {
	var sb strings.Builder
	sb.WriteString("//go:build tools\n\npackage tools\n\nimport (\n")
	for _, p := range pkgs {
		fmt.Fprintf(&sb, "\t_ %q\n", p)
	}
	sb.WriteString(")\n")
	return os.WriteFile(filepath.Join(dir, "tools.go"), []byte(sb.String()), 0o644)
}

func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

// major and minor split "v1.37.1" into "1" and "37".
func major(v string) string { return strings.Split(strings.TrimPrefix(v, "v"), ".")[0] }
func minor(v string) string { return strings.Split(strings.TrimPrefix(v, "v"), ".")[1] }

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// progress calls report with the time elapsed every interval until the
// returned stop is called; stop returns once no report runs any more.
func progress(every time.Duration, report func(elapsed time.Duration)) (stop func()) {
	start := time.Now()
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				report(time.Since(start))
			}
		}
	}()
	return func() { close(quit); <-done }
}

// BinariesCached reports whether every pinned upstream program a cluster
// runs is already built, so that bringing one up does not start a long
// build (KWOK, which only scale runs start, builds in about a minute).
func BinariesCached() bool {
	b := binaryPaths()
	for _, p := range []string{b.KubeAPIServer, b.KubeControllerManager, b.KubeScheduler, b.Kubelet, b.Kubectl, b.Etcd, b.Containerd, b.Ctr, b.ContainerdShim} {
		if _, err := os.Stat(p); err != nil {
			return false
		}
	}
	return true
}

// goBuild builds a package of the Tessera repository into out.
// A build that takes long (a cold Go build cache compiles the Kubernetes
// client libraries first) reports progress every 20 s.
func (c *Cluster) goBuild(ctx context.Context, out, pkg string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = c.Opts.RepoRoot
	defer progress(20*time.Second, func(elapsed time.Duration) {
		c.logf("  still building %s (%s elapsed; a cold Go build cache takes minutes)", pkg, elapsed.Round(time.Second))
	})()
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build -o %s %s: %w\n%s", out, pkg, err, b)
	}
	return nil
}
