package prepare

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
	"github.com/tessera-dev/tessera/pkg/node/driverfiles/fixture"
)

var fixtureUsed bool

var fixtureRoot = sync.OnceValues(func() (string, error) {
	fixtureUsed = true
	dir, err := os.MkdirTemp("", "tessera-prepare-driverroot-")
	if err != nil {
		return "", err
	}
	return dir, fixture.Build(context.Background(), dir, nvmlmock.DefaultDriverVersion, "")
})

// TestEveryClaimGetsTheDriver: the container of every kind of claim gets
// the fixture driver's libcuda.so.<version> read-only, the hook that links
// libcuda.so.1 to it and the ld cache update; without driver files a claim
// gets none of it.
func TestEveryClaimGetsTheDriver(t *testing.T) {
	root, err := fixtureRoot()
	if err != nil {
		t.Fatalf("fixture driver root: %v", err)
	}
	v := nvmlmock.DefaultDriverVersion
	lib := "/" + fixture.LibDir + "/libcuda.so." + v
	for _, tc := range []struct {
		name  string
		opts  []envOption
		claim *resourceapi.ResourceClaim
	}{
		{"share", nil, claim("share", share("gpu", "gpu-0", "s-1", 4*gib, 25))},
		{"whole GPU", nil, claim("whole", device("gpu", "gpu-1"))},
		{"time slice", []envOption{withTimeSlices(4)}, claim("ts", device("ts", "gpu-1-ts-2"))},
		{"MIG partition", []envOption{withMIG()}, claim("mig", device("mig", "gpu-0-mig-1g5gb-3"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, append(tc.opts, withDriverRoot(root))...)
			spec := e.injectSpec(e.prepare(tc.claim)...)
			for _, kv := range spec.Process.Env {
				if kv == "NVIDIA_VISIBLE_DEVICES=void" {
					t.Errorf("the driver's edits override the claim's NVIDIA_VISIBLE_DEVICES: %v", spec.Process.Env)
				}
			}
			var mounted bool
			for _, m := range spec.Mounts {
				if m.Destination == lib && m.Source == root+lib && slices.Contains(m.Options, "ro") {
					mounted = true
				}
			}
			if !mounted {
				t.Errorf("no read-only mount of %s from %s: %+v", lib, root, spec.Mounts)
			}
			var linked, ldcache bool
			for _, h := range spec.Hooks.CreateContainer {
				if h.Path != "/opt/tessera/bin/nvidia-cdi-hook" {
					continue
				}
				linked = linked || slices.Contains(h.Args, "libcuda.so."+v+"::/"+fixture.LibDir+"/libcuda.so.1")
				ldcache = ldcache || slices.Contains(h.Args, "update-ldcache")
			}
			if !linked || !ldcache {
				t.Errorf("createContainer hooks link libcuda.so.1 %v, update the ld cache %v: %+v", linked, ldcache, spec.Hooks)
			}
			e.unprepare(tc.claim)
			e.assertClean()
		})
	}
	t.Run("no driver files", func(t *testing.T) {
		e := newEnv(t)
		spec := e.injectSpec(e.prepare(claim("plain", device("gpu", "gpu-0")))...)
		if len(spec.Mounts) != 0 || spec.Hooks != nil {
			t.Errorf("a node without --driver-root mounted %v, hooks %+v", spec.Mounts, spec.Hooks)
		}
	})
}

func TestMain(m *testing.M) {
	code := m.Run()
	if !fixtureUsed {
		os.Exit(code)
	}
	if dir, _ := fixtureRoot(); dir != "" {
		_ = os.RemoveAll(dir)
	}
	os.Exit(code)
}
