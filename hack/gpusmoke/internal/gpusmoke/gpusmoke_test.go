package gpusmoke

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
)

func cc(t *testing.T) string {
	t.Helper()
	for _, c := range []string{os.Getenv("CC"), "cc", "gcc", "clang"} {
		if c == "" {
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	t.Skip("no C compiler")
	return ""
}

// TestProbeBuildsAndReportsMissingLibcuda builds the probe with cc and runs
// it on this machine (no GPU driver): it must say libcuda.so.1 is missing
// and exit 2, and its output must parse.
func TestProbeBuildsAndReportsMissingLibcuda(t *testing.T) {
	if _, err := os.Stat("/usr/lib/x86_64-linux-gnu/libcuda.so.1"); err == nil {
		t.Skip("this machine has libcuda.so.1")
	}
	probe, err := BuildProbe(context.Background(), cc(t), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(probe).Output()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 2 {
		t.Fatalf("probe exit %v, want 2 (libcuda missing); output %q", err, out)
	}
	r, err := ParseReport(string(out))
	if err != nil {
		t.Fatal(err)
	}
	if r.Libcuda != "missing" || !strings.Contains(r.Error, "libcuda.so.1") {
		t.Fatalf("report %+v", r)
	}
}

const cdiSpec = `cdiVersion: "0.6.0"
kind: gpu.tessera.dev/claim
devices:
- name: uid-1-gpu-0
  containerEdits:
    env: ["TESSERA_DEVICE=gpu-0", "CUDA_DEVICE_MEMORY_LIMIT_0=1024m"]
    deviceNodes:
    - path: /dev/nvidia0
      hostPath: /dev/null
      type: c
      major: 1
      minor: 3
    mounts:
    - hostPath: /tmp
      containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.1
      options: ["ro", "nosuid", "nodev", "bind"]
`

// TestBundleAppliesTheCDISpec lays out a bundle for the probe and applies a
// claim's CDI spec with the CDI library: the OCI spec gets the device
// node (and its cgroup rule), environment and mounts, the root file
// system holds the probe and its C libraries only.
func TestBundleAppliesTheCDISpec(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	probe, err := BuildProbe(ctx, cc(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	cdiDir := filepath.Join(dir, "cdi")
	if err := os.MkdirAll(cdiDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cdiDir, "claim.yaml"), []byte(cdiSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := NewBundle(ctx, filepath.Join(dir, "bundle"), probe, "64")
	if err != nil {
		t.Fatal(err)
	}
	// The driver's libcuda.so links libm: the bundle carries an image's C
	// runtime, not only what the probe links (a real GPU showed
	// "libm.so.6: cannot open shared object file").
	if m, _ := filepath.Glob(filepath.Join(b.Rootfs, "*", "*", "libm.so.6")); len(m) == 0 {
		if m, _ = filepath.Glob(filepath.Join(b.Rootfs, "*", "libm.so.6")); len(m) == 0 {
			t.Errorf("no libm.so.6 in the bundle's root file system")
		}
	}
	if err := b.ApplyCDI(cdiDir, "gpu.tessera.dev/claim=uid-1-gpu-0"); err != nil {
		t.Fatal(err)
	}
	if err := b.ApplyCDI(cdiDir, "gpu.tessera.dev/claim=nope"); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("unknown CDI device: error %v", err)
	}
	if err := b.Write(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(b.Dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec oci.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	if got := b.Env("CUDA_DEVICE_MEMORY_LIMIT_0"); got != "1024m" {
		t.Errorf("Env(CUDA_DEVICE_MEMORY_LIMIT_0) = %q", got)
	}
	if strings.Join(spec.Process.Args, " ") != "/probe 64" {
		t.Errorf("args %v", spec.Process.Args)
	}
	if !contains(spec.Process.Env, "CUDA_DEVICE_MEMORY_LIMIT_0=1024m") {
		t.Errorf("env %v", spec.Process.Env)
	}
	if len(spec.Linux.Devices) != 1 || spec.Linux.Devices[0].Path != "/dev/nvidia0" {
		t.Errorf("devices %+v", spec.Linux.Devices)
	}
	allowed := false
	for _, r := range spec.Linux.Resources.Devices {
		if r.Allow && r.Major != nil && *r.Major == 1 && r.Minor != nil && *r.Minor == 3 {
			allowed = true
		}
	}
	if !allowed {
		t.Errorf("no cgroup rule for the device: %+v", spec.Linux.Resources.Devices)
	}
	mounted := false
	for _, m := range spec.Mounts {
		if m.Destination == "/usr/lib/x86_64-linux-gnu/libcuda.so.1" {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("mounts %+v", spec.Mounts)
	}
	if _, err := os.Stat(filepath.Join(b.Rootfs, "probe")); err != nil {
		t.Error(err)
	}
	libc := false
	_ = filepath.Walk(b.Rootfs, func(p string, info os.FileInfo, err error) error {
		if err == nil && strings.HasPrefix(info.Name(), "libc.so") {
			libc = true
		}
		if err == nil && strings.HasPrefix(info.Name(), "libcuda") {
			t.Errorf("the root file system has %s: driver files must come from the CDI spec only", p)
		}
		return nil
	})
	if !libc {
		t.Error("libc missing from the root file system")
	}
}

func TestParseReportAndLimit(t *testing.T) {
	r, err := ParseReport("libcuda=ok\ninit=0\ndevices=1\nfree=1000\ntotal=2000\nallocated=1536\nstop=2\n")
	if err != nil {
		t.Fatal(err)
	}
	if r.Devices != 1 || r.Allocated != 1536 || r.Stop != 2 || r.Total != 2000 {
		t.Fatalf("%+v", r)
	}
	if r.LimitHeld(1024, 0) {
		t.Error("1536 allocated held a 1024 limit")
	}
	if !(Report{Libcuda: "ok", Allocated: 1000, Total: 1024}).LimitHeld(1024, 0) {
		t.Error("1000 of 1024 did not hold")
	}
	// MPS on an H200: cuMemGetInfo shows the whole GPU, the pinned limit
	// still refused the second 256 MiB step.
	if !(Report{Libcuda: "ok", Allocated: 256 << 20, Free: 535402352, Total: 150109880320}).LimitHeld(1<<30, 64<<20) {
		t.Error("256 MiB under MPS with a 1 GiB limit did not hold")
	}
	if _, err := ParseReport("garbage"); err == nil {
		t.Error("no error for output without libcuda=")
	}
	if _, err := ParseReport("libcuda=ok\nfree=x"); err == nil || !strings.Contains(err.Error(), "free=x") {
		t.Errorf("error %v", err)
	}
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}
