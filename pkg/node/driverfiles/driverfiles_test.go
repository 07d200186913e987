package driverfiles_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2/ktesting"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
	"github.com/tessera-dev/tessera/pkg/node/driverfiles"
	"github.com/tessera-dev/tessera/pkg/node/driverfiles/fixture"
)

var (
	fixtureOnce sync.Once
	fixtureRoot string
	fixtureErr  error
)

// fixtureDriver builds the fixture driver root once per test binary.
func fixtureDriver(t testing.TB) string {
	t.Helper()
	fixtureOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tessera-driverroot-")
		if err != nil {
			fixtureErr = err
			return
		}
		fixtureRoot = dir
		fixtureErr = fixture.Build(context.Background(), dir, nvmlmock.DefaultDriverVersion, "")
	})
	if fixtureErr != nil {
		t.Fatalf("fixture driver root: %v", fixtureErr)
	}
	return fixtureRoot
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fixtureRoot != "" {
		_ = os.RemoveAll(fixtureRoot)
	}
	os.Exit(code)
}

func mockNVML(t testing.TB, version string) *nvmlmock.Server {
	t.Helper()
	spec, err := nvmlmock.ParseProfile("t4:1")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := nvmlmock.New(nvmlmock.Options{Spec: spec, DriverVersion: version})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

func mountByContainerPath(e cdispecs.ContainerEdits, p string) *cdispecs.Mount {
	for _, m := range e.Mounts {
		if m.ContainerPath == p {
			return m
		}
	}
	return nil
}

func hookArgs(e cdispecs.ContainerEdits, sub string) []string {
	for _, h := range e.Hooks {
		if len(h.Args) > 1 && h.Args[1] == sub {
			return h.Args
		}
	}
	return nil
}

func TestEditsFromFixtureRoot(t *testing.T) {
	root := fixtureDriver(t)
	v := nvmlmock.DefaultDriverVersion
	lib := "/" + fixture.LibDir
	for _, tc := range []struct {
		name, driverRoot, containerRoot string
	}{
		// The plugin sees the driver where the host has it (local cluster,
		// gpu-smoke).
		{name: "same root", driverRoot: root, containerRoot: ""},
		// The chart: the host's /run/nvidia/driver mounted at the fixture's
		// path; the spec must name host paths.
		{name: "mounted root", driverRoot: "/run/nvidia/driver", containerRoot: root},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			d, err := driverfiles.New(driverfiles.Options{
				DriverRoot: tc.driverRoot, ContainerDriverRoot: tc.containerRoot,
				HookPath: "/var/lib/tessera/bin/nvidia-cdi-hook", NVML: mockNVML(t, v),
			})
			if err != nil {
				t.Fatal(err)
			}
			e, err := d.Edits(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{lib + "/libcuda.so." + v, lib + "/libnvidia-ml.so." + v, lib + "/libnvidia-ptxjitcompiler.so." + v, "/usr/bin/nvidia-smi", "/" + fixture.FirmwareFile(v)} {
				m := mountByContainerPath(e, f)
				if m == nil {
					t.Errorf("no mount of %s; mounts: %v", f, mountPaths(e))
					continue
				}
				if want := filepath.Join(tc.driverRoot, f); m.HostPath != want {
					t.Errorf("mount %s: host path %s, want %s", f, m.HostPath, want)
				}
				if !slices.Contains(m.Options, "ro") {
					t.Errorf("mount %s is not read-only: %v", f, m.Options)
				}
			}
			links := hookArgs(e, "create-symlinks")
			if !slices.Contains(links, "--link") || !slices.ContainsFunc(links, func(a string) bool {
				return a == "libcuda.so."+v+"::"+lib+"/libcuda.so.1"
			}) {
				t.Errorf("create-symlinks hook does not link libcuda.so.1: %v", links)
			}
			ld := hookArgs(e, "update-ldcache")
			if !slices.Contains(ld, lib) {
				t.Errorf("update-ldcache hook does not add %s: %v", lib, ld)
			}
			for _, h := range e.Hooks {
				if h.Path != "/var/lib/tessera/bin/nvidia-cdi-hook" || h.HookName != "createContainer" {
					t.Errorf("hook %v: want path /var/lib/tessera/bin/nvidia-cdi-hook, createContainer", h)
				}
			}
			if len(e.DeviceNodes) != 0 {
				t.Errorf("device nodes are package cdispec's, got %v", e.DeviceNodes)
			}
			// Tessera sets NVIDIA_VISIBLE_DEVICES per claim; nvcdi's "void"
			// must not override it.
			if slices.ContainsFunc(e.Env, func(kv string) bool { return strings.HasPrefix(kv, "NVIDIA_VISIBLE_DEVICES=") }) {
				t.Errorf("driver env %v sets NVIDIA_VISIBLE_DEVICES", e.Env)
			}
		})
	}
}

// --disabled-cdi-hooks leaves exactly the named hooks out of the driver's
// edits, and nothing else.
func TestDisabledHooks(t *testing.T) {
	root := fixtureDriver(t)
	subcommands := func(disabled ...string) []string {
		t.Helper()
		_, ctx := ktesting.NewTestContext(t)
		d, err := driverfiles.New(driverfiles.Options{DriverRoot: root, HookPath: "/h", NVML: mockNVML(t, nvmlmock.DefaultDriverVersion), DisabledHooks: disabled})
		if err != nil {
			t.Fatal(err)
		}
		e, err := d.Edits(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var subs []string
		for _, h := range e.Hooks {
			subs = append(subs, h.Args[1])
		}
		return subs
	}
	all := subcommands()
	for _, want := range []string{"create-symlinks", "update-ldcache"} {
		if !slices.Contains(all, want) {
			t.Fatalf("default hooks %v lack %s", all, want)
		}
	}
	for _, tc := range []struct {
		name     string
		disabled []string
	}{
		{"one", []string{"enable-cuda-compat"}},
		{"two", []string{"update-ldcache", "disable-device-node-modification"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, h := range tc.disabled {
				if !slices.Contains(all, h) {
					t.Fatalf("%s is not among the default hooks %v: the case proves nothing", h, all)
				}
			}
			got := subcommands(tc.disabled...)
			want := slices.DeleteFunc(slices.Clone(all), func(s string) bool { return slices.Contains(tc.disabled, s) })
			if !slices.Equal(got, want) {
				t.Errorf("hooks with %v disabled: %v, want %v", tc.disabled, got, want)
			}
		})
	}
}

// A driver upgraded under a running plugin: the next claim gets the new
// files; a version with no files is an error naming both.
func TestEditsFollowDriverVersion(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	root := fixtureDriver(t)
	srv := mockNVML(t, nvmlmock.DefaultDriverVersion)
	d, err := driverfiles.New(driverfiles.Options{DriverRoot: root, HookPath: "/usr/bin/nvidia-cdi-hook", NVML: srv})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Edits(ctx); err != nil {
		t.Fatal(err)
	}
	srv.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return "999.1.2", nvml.SUCCESS }
	_, err = d.Edits(ctx)
	if err == nil || !strings.Contains(err.Error(), "999.1.2") || !strings.Contains(err.Error(), root) {
		t.Fatalf("edits for a driver version without files: %v, want an error naming the version and root", err)
	}
	if err := fixture.Build(ctx, root, "999.1.2", ""); err != nil {
		t.Fatal(err)
	}
	e, err := d.Edits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if mountByContainerPath(e, "/"+fixture.LibDir+"/libcuda.so.999.1.2") == nil {
		t.Fatalf("after the upgrade: no libcuda.so.999.1.2; mounts %v", mountPaths(e))
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	srv := mockNVML(t, nvmlmock.DefaultDriverVersion)
	for _, tc := range []struct {
		name string
		opts driverfiles.Options
		want string
	}{
		{"relative driver root", driverfiles.Options{DriverRoot: "run/nvidia", HookPath: "/h", NVML: srv}, "--driver-root"},
		{"relative container root", driverfiles.Options{DriverRoot: "/", ContainerDriverRoot: "x", HookPath: "/h", NVML: srv}, "--container-driver-root"},
		{"relative hook", driverfiles.Options{DriverRoot: "/", HookPath: "nvidia-cdi-hook", NVML: srv}, "--nvidia-cdi-hook-path"},
		{"unknown hook", driverfiles.Options{DriverRoot: "/", HookPath: "/h", NVML: srv, DisabledHooks: []string{"update-ld-cache"}}, `--disabled-cdi-hooks: "update-ld-cache" is not an nvidia-cdi-hook createContainer hook: use create-symlinks, update-ldcache`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := driverfiles.New(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

func mountPaths(e cdispecs.ContainerEdits) []string {
	var out []string
	for _, m := range e.Mounts {
		out = append(out, m.ContainerPath)
	}
	return out
}
