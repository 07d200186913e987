// Package gpusmoke holds the parts of `make gpu-smoke` that need no GPU:
// building the CUDA driver-API probe, laying out an OCI bundle for it,
// applying a claim's CDI spec to the bundle's OCI spec with the CDI
// library, and reading the probe's report. hack/gpusmoke drives them on a
// machine with a real NVIDIA GPU.
package gpusmoke

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

//go:embed probe.c.src
var probeSource []byte

// BuildProbe compiles the probe with cc into dir and returns its path.
func BuildProbe(ctx context.Context, cc, dir string) (string, error) {
	out := filepath.Join(dir, "probe")
	return out, BuildProbeTo(ctx, cc, out)
}

// BuildProbeTo compiles the probe with cc into the executable out (its
// source goes next to it, as out.c).
func BuildProbeTo(ctx context.Context, cc, out string) error {
	src := out + ".c"
	if err := os.WriteFile(src, probeSource, 0o644); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, cc, "-O2", "-o", out, src, "-ldl")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the probe with %s: %v: %s", cc, err, b)
	}
	return nil
}

// Bundle is an OCI bundle: config.json and a root file system holding the
// probe, the C libraries it links (from ldd) and the rest of the C runtime
// that any container image provides (libm, libpthread, librt, libgcc_s:
// libcuda.so links them), so that whatever driver files the container sees
// come from the CDI spec.
type Bundle struct {
	Dir    string
	Rootfs string
	Spec   *oci.Spec
}

// NewBundle lays out a bundle in dir for the probe binary with args.
func NewBundle(ctx context.Context, dir, probe string, args ...string) (*Bundle, error) {
	b := &Bundle{Dir: dir, Rootfs: filepath.Join(dir, "rootfs")}
	if err := copyInto(b.Rootfs, probe, "/probe"); err != nil {
		return nil, err
	}
	libs, err := linkedLibraries(ctx, probe)
	if err != nil {
		return nil, err
	}
	libs = append(libs, runtimeLibraries(libs)...)
	for _, l := range libs {
		if err := copyInto(b.Rootfs, l, l); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{"dev", "proc", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(b.Rootfs, d), 0o755); err != nil {
			return nil, err
		}
	}
	b.Spec = &oci.Spec{
		Version: oci.Version,
		Root:    &oci.Root{Path: "rootfs", Readonly: true},
		Process: &oci.Process{
			Args: append([]string{"/probe"}, args...),
			Env:  []string{"PATH=/usr/bin:/bin"},
			Cwd:  "/",
		},
		Hostname: "gpu-smoke",
		Mounts: []oci.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev"}},
		},
		Linux: &oci.Linux{
			Namespaces: []oci.LinuxNamespace{{Type: oci.PIDNamespace}, {Type: oci.MountNamespace}, {Type: oci.IPCNamespace}, {Type: oci.UTSNamespace}},
			Resources:  &oci.LinuxResources{Devices: []oci.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}},
		},
	}
	return b, nil
}

// ApplyCDI injects CDI devices (vendor/class=name) from the specs in
// cdiDir into the bundle's OCI spec, as a CDI-aware runtime does.
func (b *Bundle) ApplyCDI(cdiDir string, devices ...string) error {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(cdiDir), cdi.WithAutoRefresh(false))
	if err != nil {
		return fmt.Errorf("read CDI specs in %s: %w", cdiDir, err)
	}
	if unresolved, err := cache.InjectDevices(b.Spec, devices...); err != nil {
		return fmt.Errorf("apply CDI devices %v (unresolved %v): %w", devices, unresolved, err)
	}
	return nil
}

// Write writes config.json.
func (b *Bundle) Write() error {
	data, err := json.MarshalIndent(b.Spec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(b.Dir, "config.json"), data, 0o644)
}

// Report is what the probe printed.
type Report struct {
	Libcuda   string
	Init      int
	Devices   int
	Free      uint64
	Total     uint64
	Allocated uint64
	Stop      int
	Error     string
}

// ParseReport reads the probe's key=value lines.
func ParseReport(out string) (Report, error) {
	r := Report{Init: -1, Stop: -1}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok {
			continue
		}
		var err error
		switch k {
		case "libcuda":
			r.Libcuda = v
		case "error":
			r.Error = v
		case "init":
			r.Init, err = strconv.Atoi(v)
		case "devices":
			r.Devices, err = strconv.Atoi(v)
		case "stop":
			r.Stop, err = strconv.Atoi(v)
		case "free":
			r.Free, err = strconv.ParseUint(v, 10, 64)
		case "total":
			r.Total, err = strconv.ParseUint(v, 10, 64)
		case "allocated":
			r.Allocated, err = strconv.ParseUint(v, 10, 64)
		}
		if err != nil {
			return r, fmt.Errorf("probe line %q: %w", sc.Text(), err)
		}
	}
	if r.Libcuda == "" {
		return r, fmt.Errorf("probe printed no libcuda= line: %q", out)
	}
	return r, nil
}

// LimitHeld says whether a share of limit bytes held: the probe could not
// allocate more than the limit (plus slack for the probe's own context).
// What cuMemGetInfo reports as total does not matter: under MPS it is the
// whole GPU while the pinned-memory limit still refuses allocations (seen
// on an H200: total 143155 MiB, 256 MiB allocated under a 1024 MiB limit).
func (r Report) LimitHeld(limit, slack uint64) bool {
	return r.Allocated <= limit+slack
}

// Env returns the value of the variable key in the bundle's process
// environment after ApplyCDI (the claim's enforcement settings).
func (b *Bundle) Env(key string) string {
	for _, e := range b.Spec.Process.Env {
		if k, v, ok := strings.Cut(e, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// linkedLibraries lists the shared objects probe loads at start (ldd).
func linkedLibraries(ctx context.Context, probe string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ldd", probe).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", probe, err)
	}
	var libs []string
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") {
				if p, err := filepath.EvalSymlinks(f); err == nil {
					libs = append(libs, f)
					if p != f {
						libs = append(libs, p)
					}
				}
			}
		}
	}
	return libs, nil
}

// imageRuntime is the C runtime every container image with glibc has,
// beyond what the probe itself links; the driver's libraries (libcuda.so
// links libm, libpthread and librt) expect it from the image.
var imageRuntime = []string{"libm.so.6", "libpthread.so.0", "librt.so.1", "libdl.so.2", "libgcc_s.so.1"}

// runtimeLibraries finds imageRuntime next to the libc.so.6 among libs.
func runtimeLibraries(libs []string) []string {
	var out []string
	for _, l := range libs {
		if filepath.Base(l) != "libc.so.6" {
			continue
		}
		for _, name := range imageRuntime {
			f := filepath.Join(filepath.Dir(l), name)
			if slices.Contains(libs, f) {
				continue
			}
			if p, err := filepath.EvalSymlinks(f); err == nil {
				out = append(out, f)
				if p != f {
					out = append(out, p)
				}
			}
		}
		break
	}
	return out
}

// copyInto copies the file src (following links) to dst inside root.
func copyInto(root, src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	target := filepath.Join(root, dst)
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	return os.WriteFile(target, data, st.Mode().Perm())
}
