package driverfiles_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2/ktesting"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
	"github.com/tessera-dev/tessera/pkg/node/driverfiles"
	"github.com/tessera-dev/tessera/pkg/node/driverfiles/fixture"
)

// needsContainer are the hooks that need a real container (its /proc, a CUDA
// image's compat directory): run on a bare container root they fail.
var needsContainer = []string{"update-application-profile", "disable-device-node-modification", "enable-cuda-compat"}

// containerRoot is what a runtime has when it runs a container's
// createContainer hooks: a bundle whose root holds the driver's mounts (as
// copies) and is a mount point, and the OCI state the hooks read.
type containerRoot struct {
	rootfs string
	state  []byte
	hooks  []*cdispecs.Hook
}

// newContainerRoot builds the real nvidia-cdi-hook (from the module's pins)
// and a container root with the fixture driver's edits. It needs root (the
// update-ldcache hook pivots into the container root).
func newContainerRoot(tb testing.TB) *containerRoot {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("the update-ldcache hook needs root (pivot_root into the container root)")
	}
	if testing.Short() {
		tb.Skip("builds nvidia-cdi-hook")
	}
	_, ctx := ktesting.NewTestContext(tb)
	root := fixtureDriver(tb)
	dir := tb.TempDir()
	hook := filepath.Join(dir, "nvidia-cdi-hook")
	build := exec.CommandContext(ctx, "go", "build", "-o", hook, "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook")
	if out, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("build nvidia-cdi-hook: %v\n%s", err, out)
	}
	d, err := driverfiles.New(driverfiles.Options{DriverRoot: root, HookPath: hook, NVML: mockNVML(tb, nvmlmock.DefaultDriverVersion)})
	if err != nil {
		tb.Fatal(err)
	}
	e, err := d.Edits(ctx)
	if err != nil {
		tb.Fatal(err)
	}

	bundle := filepath.Join(dir, "bundle")
	rootfs := filepath.Join(bundle, "rootfs")
	for _, p := range []string{"etc", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, p), 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	for _, m := range e.Mounts {
		data, err := os.ReadFile(m.HostPath)
		if err != nil {
			tb.Fatalf("mount source %s: %v", m.HostPath, err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(rootfs, m.ContainerPath)), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(rootfs, m.ContainerPath), data, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	// A runtime's container root is a mount point.
	if err := unix.Mount(rootfs, rootfs, "", unix.MS_BIND, ""); err != nil {
		tb.Fatalf("bind-mount the container root: %v", err)
	}
	tb.Cleanup(func() { _ = unix.Unmount(rootfs, unix.MNT_DETACH) })
	config, _ := json.Marshal(map[string]any{"ociVersion": "1.2.0", "root": map[string]any{"path": "rootfs"}, "process": map[string]any{"env": []string{}}})
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), config, 0o644); err != nil {
		tb.Fatal(err)
	}
	state, _ := json.Marshal(map[string]any{"ociVersion": "1.2.0", "id": "t", "status": "creating", "pid": os.Getpid(), "bundle": bundle})
	return &containerRoot{rootfs: rootfs, state: state, hooks: e.Hooks}
}

// run runs one hook as the runtime does: its path, args and env, the
// state on stdin.
func (c *containerRoot) run(ctx context.Context, h *cdispecs.Hook) error {
	cmd := exec.CommandContext(ctx, h.Path, h.Args[1:]...)
	cmd.Env = h.Env
	cmd.Stdin = bytes.NewReader(c.state)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("hook %v: %w\n%s", h.Args, err, out)
	}
	return nil
}

// TestHooksRunOnAContainerRoot runs what a runtime runs for a container
// with the driver's edits, without a cluster: the mounts (as copies) into
// a container root, then every createContainer hook of the spec with the
// real nvidia-cdi-hook. libcuda.so.1 must then resolve to the fixture's
// libcuda.so.<version> and the container's ld cache must list it, as the
// CUDA runtime's dlopen needs.
func TestHooksRunOnAContainerRoot(t *testing.T) {
	c := newContainerRoot(t)
	for _, h := range c.hooks {
		if slices.Contains(needsContainer, h.Args[1]) {
			continue
		}
		if err := c.run(t.Context(), h); err != nil {
			t.Fatal(err)
		}
	}
	lib := filepath.Join(c.rootfs, fixture.LibDir)
	got, err := filepath.EvalSymlinks(filepath.Join(lib, "libcuda.so.1"))
	if err != nil || got != filepath.Join(lib, "libcuda.so."+nvmlmock.DefaultDriverVersion) {
		t.Errorf("libcuda.so.1 resolves to %q (%v), want the fixture's libcuda.so.%s", got, err, nvmlmock.DefaultDriverVersion)
	}
	cache, err := os.ReadFile(filepath.Join(c.rootfs, "etc/ld.so.cache"))
	if err != nil || !bytes.Contains(cache, []byte("libcuda.so.1")) {
		t.Errorf("the container's ld cache does not list libcuda.so.1 (%v)", err)
	}
}

// BenchmarkCreateContainerHooks times each createContainer hook of a
// claim's spec as the runtime runs it at every container start (a process
// each), on a container root with the fixture driver's files. Hooks that
// need a real container are not timed.
func BenchmarkCreateContainerHooks(b *testing.B) {
	c := newContainerRoot(b)
	for _, h := range c.hooks {
		if slices.Contains(needsContainer, h.Args[1]) {
			continue
		}
		b.Run(h.Args[1], func(b *testing.B) {
			for b.Loop() {
				if err := c.run(b.Context(), h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
