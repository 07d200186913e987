package driverfiles_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-dev/tessera/pkg/driverfiles"
	"github.com/tessera-dev/tessera/pkg/driverfiles/fixture"
	"github.com/tessera-dev/tessera/pkg/nvmlmock"
)

// TestHooksRunOnAContainerRoot runs what a runtime runs for a container
// with the driver's edits, without a cluster: the mounts (as copies) into
// a container root, then every createContainer hook of the spec with the
// real nvidia-cdi-hook (built from the module go.mod pins). libcuda.so.1
// must then resolve to the fixture's libcuda.so.<version> and the
// container's ld cache must list it, as the CUDA runtime's dlopen needs.
func TestHooksRunOnAContainerRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the update-ldcache hook needs root (pivot_root into the container root)")
	}
	if testing.Short() {
		t.Skip("builds nvidia-cdi-hook")
	}
	_, ctx := ktesting.NewTestContext(t)
	root := fixtureDriver(t)
	dir := t.TempDir()
	hook := filepath.Join(dir, "nvidia-cdi-hook")
	build := exec.CommandContext(ctx, "go", "build", "-o", hook, "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build nvidia-cdi-hook: %v\n%s", err, out)
	}
	d, err := driverfiles.New(driverfiles.Options{DriverRoot: root, HookPath: hook, NVML: mockNVML(t, nvmlmock.DefaultDriverVersion)})
	if err != nil {
		t.Fatal(err)
	}
	e, err := d.Edits(ctx)
	if err != nil {
		t.Fatal(err)
	}

	bundle := filepath.Join(dir, "bundle")
	rootfs := filepath.Join(bundle, "rootfs")
	for _, p := range []string{"etc", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range e.Mounts {
		data, err := os.ReadFile(m.HostPath)
		if err != nil {
			t.Fatalf("mount source %s: %v", m.HostPath, err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(rootfs, m.ContainerPath)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(rootfs, m.ContainerPath), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A runtime's container root is a mount point.
	if err := unix.Mount(rootfs, rootfs, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("bind-mount the container root: %v", err)
	}
	defer func() { _ = unix.Unmount(rootfs, unix.MNT_DETACH) }()
	config, _ := json.Marshal(map[string]any{"ociVersion": "1.2.0", "root": map[string]any{"path": "rootfs"}, "process": map[string]any{"env": []string{}}})
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), config, 0o644); err != nil {
		t.Fatal(err)
	}
	state, _ := json.Marshal(map[string]any{"ociVersion": "1.2.0", "id": "t", "status": "creating", "pid": os.Getpid(), "bundle": bundle})
	for _, h := range e.Hooks {
		if h.Args[1] == "update-application-profile" || h.Args[1] == "disable-device-node-modification" || h.Args[1] == "enable-cuda-compat" {
			continue // need a real container (its /proc, a CUDA image's compat directory)
		}
		cmd := exec.CommandContext(ctx, h.Path, h.Args[1:]...)
		cmd.Env = h.Env
		cmd.Stdin = bytes.NewReader(state)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("hook %v: %v\n%s", h.Args, err, out)
		}
	}
	lib := filepath.Join(rootfs, fixture.LibDir)
	got, err := filepath.EvalSymlinks(filepath.Join(lib, "libcuda.so.1"))
	if err != nil || got != filepath.Join(lib, "libcuda.so."+nvmlmock.DefaultDriverVersion) {
		t.Errorf("libcuda.so.1 resolves to %q (%v), want the fixture's libcuda.so.%s", got, err, nvmlmock.DefaultDriverVersion)
	}
	cache, err := os.ReadFile(filepath.Join(rootfs, "etc/ld.so.cache"))
	if err != nil || !bytes.Contains(cache, []byte("libcuda.so.1")) {
		t.Errorf("the container's ld cache does not list libcuda.so.1 (%v)", err)
	}
}
