package prepare

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/cdispec"
	"github.com/tessera-dev/tessera/pkg/timeslice"
)

type crashed struct{ point string }

// crashAt makes the Preparer panic at a crash point, as if the process
// died there; the test recovers and starts a new Preparer.
func (e *env) crashAt(point string) {
	e.p.opts.Crash = func(p string) {
		if p == point {
			panic(crashed{p})
		}
	}
}

func (e *env) try(f func()) (hit bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(crashed); !ok {
				panic(r)
			}
			hit = true
		}
	}()
	f()
	return false
}

// TestCrashAtEveryPoint interrupts prepare and unprepare of every claim
// kind at every crash point, restarts, replays the kubelet's calls and
// checks that nothing leaks and that a completed prepare never changes.
func TestCrashAtEveryPoint(t *testing.T) {
	kinds := []struct {
		name  string
		opts  []envOption
		claim func() *resourceapi.ResourceClaim
	}{
		{"share", nil, func() *resourceapi.ResourceClaim {
			return withConfig(claim("c", share("gpu", "gpu-0", "s-1", gib, 10)), resourceapi.AllocationConfigSourceClaim, nil, `"enforcement":"interposer"`)
		}},
		{"timeslice", []envOption{withTimeSlices(2)}, func() *resourceapi.ResourceClaim {
			return withConfig(claim("c", device("ts", "gpu-1-ts-1")), resourceapi.AllocationConfigSourceClaim, nil, `"timeSliceInterval":"Long"`)
		}},
		{"mig", []envOption{withMIG()}, func() *resourceapi.ResourceClaim {
			return claim("c", device("mig", "gpu-0-mig-2g10gb-2"), device("mig", "gpu-0-mig-1g5gb-6"))
		}},
	}
	for _, k := range kinds {
		for _, point := range CrashPoints {
			t.Run(k.name+"/"+point, func(t *testing.T) {
				e := newEnv(t, k.opts...)
				c := k.claim()
				e.crashAt(point)
				var first []string
				hitPrepare := e.try(func() { first = e.prepare(c) })
				e.start()
				if hitPrepare {
					// The kubelet saw no result; everything but a completed
					// prepare is rolled back at start.
					if point != CrashPrepareCompleted {
						if len(e.files("cdi")) != 0 || e.migInstances() != 0 {
							t.Errorf("after crash at %s: specs %v, %d MIG instances", point, e.files("cdi"), e.migInstances())
						}
					}
					first = e.prepare(c)
				}
				again := e.prepare(c)
				if !slices.Equal(first, again) {
					t.Errorf("devices changed: %v then %v", first, again)
				}
				if k.name == "mig" && e.migInstances() != 2 {
					t.Errorf("%d MIG instances while prepared", e.migInstances())
				}
				e.inject(again...)
				e.crashAt(point)
				hitUnprepare := e.try(func() { e.unprepare(c) })
				e.start()
				if hitUnprepare {
					e.unprepare(c) // the kubelet retries
				}
				e.assertClean()
				if k.name == "timeslice" {
					st, _ := timeslice.ReadRecorded(filepath.Join(e.dir, "mock-timeslice.json"))
					if iv := st[e.inv.GPUs[1].UUID]; iv != "Default" {
						t.Errorf("time slice left at %s", iv)
					}
				}
				if !hitPrepare && !hitUnprepare {
					t.Logf("%s is not on the path of a %s claim", point, k.name)
				}
			})
		}
	}
}

func TestRecoverRestoresAndRepairs(t *testing.T) {
	e := newEnv(t, withMIG())
	mc := claim("m", device("mig", "gpu-0-mig-3g20gb-4"))
	ids := e.prepare(mc)
	envBefore, _ := e.inject(ids...)
	specPath := filepath.Join(e.opts.CDI.Path, cdispec.SpecName(string(mc.UID)))

	// A spec that vanished (e.g. a tmpfs /var/run/cdi) is restored.
	if err := os.Remove(specPath); err != nil {
		t.Fatal(err)
	}
	e.start()
	if _, err := os.Stat(specPath); err != nil {
		t.Fatalf("spec not restored: %v", err)
	}

	// A corrupt checkpoint of a claim still in use is rebuilt from the API
	// server, adopting the MIG instance.
	cpPath := filepath.Join(e.dir, "checkpoint", string(mc.UID)+".json")
	if err := os.WriteFile(cpPath, []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.lastList = []resourceapi.ResourceClaim{*mc}
	e.start()
	if got := e.p.Prepared(); !slices.Equal(got, []string{string(mc.UID)}) {
		t.Fatalf("not repaired: %v", got)
	}
	if e.migInstances() != 1 {
		t.Errorf("%d MIG instances after repair", e.migInstances())
	}
	envAfter, _ := e.inject(ids...)
	if envAfter["NVIDIA_VISIBLE_DEVICES"] != envBefore["NVIDIA_VISIBLE_DEVICES"] {
		t.Errorf("repair changed the MIG device: %s -> %s", envBefore["NVIDIA_VISIBLE_DEVICES"], envAfter["NVIDIA_VISIBLE_DEVICES"])
	}
	if again := e.prepare(mc); !slices.Equal(again, ids) {
		t.Errorf("devices changed after repair: %v", again)
	}
	aside, _ := filepath.Glob(cpPath + ".corrupt-*")
	if len(aside) != 1 {
		t.Errorf("corrupt checkpoint not kept aside: %v", aside)
	}

	// A corrupt checkpoint of a claim that is gone: its spec says which
	// MIG instance was created for it, and that is destroyed.
	if err := os.WriteFile(cpPath, []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.lastList = nil
	e.start()
	if got := e.p.Prepared(); len(got) != 0 {
		t.Errorf("claim kept: %v", got)
	}
	for _, a := range aside {
		_ = os.Remove(a)
	}
	matches, _ := filepath.Glob(filepath.Join(e.dir, "checkpoint", "*.corrupt-*"))
	for _, m := range matches {
		_ = os.Remove(m)
	}
	e.assertClean()
}

func TestRecoverAfterReboot(t *testing.T) {
	e := newEnv(t)
	c := claim("c", share("gpu", "gpu-0", "s", gib, 0))
	e.prepare(c)
	e.bootID = "boot-2"
	e.start()
	e.assertClean()
}

func TestRepairWaitsForAPIServer(t *testing.T) {
	e := newEnv(t)
	c := claim("c", share("gpu", "gpu-0", "s", gib, 0))
	e.prepare(c)
	if err := os.Remove(filepath.Join(e.dir, "checkpoint", string(c.UID)+".json")); err != nil {
		t.Fatal(err)
	}
	// Start with an API server that does not answer.
	down := true
	list := func(context.Context) ([]resourceapi.ResourceClaim, error) {
		if down {
			return nil, errors.New("connection refused")
		}
		return []resourceapi.ResourceClaim{*c}, nil
	}
	p := New(e.opts)
	if err := p.Recover(e.ctx, list); err != nil {
		t.Fatal(err)
	}
	if got := p.Pending(); !slices.Equal(got, []string{string(c.UID)}) {
		t.Fatalf("pending %v", got)
	}
	if len(e.files("cdi")) != 1 {
		t.Error("spec of an unresolved claim removed")
	}
	down = false
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	p.RunRepairs(ctx, list, 10*time.Millisecond)
	if len(p.Pending()) != 0 || !slices.Equal(p.Prepared(), []string{string(c.UID)}) {
		t.Fatalf("pending %v, prepared %v", p.Pending(), p.Prepared())
	}
}
