package prepare

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/node/cdispec"
	"github.com/tessera-dev/tessera/pkg/node/timeslice"
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
	e.apiClaims = []resourceapi.ResourceClaim{*mc}
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
	e.apiClaims = nil
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
	e.apiDown = true
	e.apiClaims = []resourceapi.ResourceClaim{*c}
	p := New(e.opts)
	if err := p.Recover(e.ctx); err != nil {
		t.Fatal(err)
	}
	if got := p.Pending(); !slices.Equal(got, []string{string(c.UID)}) {
		t.Fatalf("pending %v", got)
	}
	if len(e.files("cdi")) != 1 {
		t.Error("spec of an unresolved claim removed")
	}
	e.apiDown = false
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	p.RunRepairs(ctx, 10*time.Millisecond)
	if len(p.Pending()) != 0 || !slices.Equal(p.Prepared(), []string{string(c.UID)}) {
		t.Fatalf("pending %v, prepared %v", p.Pending(), p.Prepared())
	}
	// The repair read the one claim its spec names; it never lists.
	for _, g := range e.gets {
		if g != c.Namespace+"/"+c.Name {
			t.Errorf("repair read claim %s, want only %s/%s", g, c.Namespace, c.Name)
		}
	}
}

// A claim whose checkpoint is corrupt keeps what its spec says it holds
// while the API server cannot confirm it: no second claim is prepared on
// its share, time slice, interval or MIG device. Once the API server
// answers, a collision repairs it first: a claim still in use keeps its
// devices, one that is gone frees them.
func TestLostCheckpointHoldsDevices(t *testing.T) {
	interval := func(c *resourceapi.ResourceClaim, v string) *resourceapi.ResourceClaim {
		return withConfig(c, resourceapi.AllocationConfigSourceClaim, nil, `"timeSliceInterval":"`+v+`"`)
	}
	for _, tc := range []struct {
		name     string
		opts     []envOption
		holder   *resourceapi.ResourceClaim
		intruder *resourceapi.ResourceClaim
		want     string
	}{
		{name: "share capacity", holder: claim("a", share("gpu", "gpu-0", "s-1", 10*gib, 0)), intruder: claim("b", share("gpu", "gpu-0", "s-2", 10*gib, 0)), want: "oversubscribed"},
		{name: "same share", holder: claim("a", share("gpu", "gpu-0", "s-1", gib, 0)), intruder: claim("b", share("gpu", "gpu-0", "s-1", gib, 0)), want: "share s-1 is already prepared"},
		{name: "time slice", opts: []envOption{withTimeSlices(2)}, holder: claim("a", device("ts", "gpu-1-ts-0")), intruder: claim("b", device("ts", "gpu-1-ts-0")), want: "already prepared"},
		{name: "share next to time slice", opts: []envOption{withTimeSlices(2)}, holder: claim("a", device("ts", "gpu-1-ts-0")), intruder: claim("b", share("gpu", "gpu-1", "s-1", gib, 0)), want: "time-sliced"},
		{name: "interval", opts: []envOption{withTimeSlices(2)}, holder: interval(claim("a", device("ts", "gpu-1-ts-0")), "Long"), intruder: interval(claim("b", device("ts", "gpu-1-ts-1")), "Short"), want: "interval"},
		{name: "MIG device", opts: []envOption{withMIG()}, holder: claim("a", device("mig", "gpu-0-mig-3g20gb-4")), intruder: claim("b", device("mig", "gpu-0-mig-3g20gb-4")), want: "already prepared"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.opts...)
			e.prepare(tc.holder)
			cp := filepath.Join(e.dir, "checkpoint", string(tc.holder.UID)+".json")
			if err := os.WriteFile(cp, []byte("{garbage"), 0o600); err != nil {
				t.Fatal(err)
			}
			// Restart while the API server is down: the holder cannot be
			// repaired, the intruder must not get its devices.
			e.apiDown = true
			e.apiClaims = []resourceapi.ResourceClaim{*tc.holder}
			e.start()
			_, err := e.p.Prepare(e.ctx, tc.intruder)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "lost its checkpoint") {
				t.Fatalf("intruder prepared while the holder's checkpoint was lost: %v (want an error containing %q)", err, tc.want)
			}
			// The API server is back and the holder still in use: the
			// collision repairs it, and the intruder is still refused.
			e.apiDown = false
			if _, err := e.p.Prepare(e.ctx, tc.intruder); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("intruder prepared next to a repaired holder: %v", err)
			}
			if got := e.p.Prepared(); !slices.Equal(got, []string{string(tc.holder.UID)}) || len(e.p.Pending()) != 0 {
				t.Fatalf("after the repair: prepared %v, pending %v; want the holder prepared, none pending", got, e.p.Pending())
			}
			// The holder is gone from the cluster (its checkpoint lost
			// again): the intruder's prepare removes its leftovers and
			// gets the devices.
			if err := os.WriteFile(cp, []byte("{garbage"), 0o600); err != nil {
				t.Fatal(err)
			}
			e.apiDown = true
			e.start()
			e.apiDown, e.apiClaims = false, nil
			e.prepare(tc.intruder)
			if got := e.p.Prepared(); !slices.Equal(got, []string{string(tc.intruder.UID)}) {
				t.Fatalf("prepared %v, want only the intruder", got)
			}
			e.unprepare(tc.intruder)
			matches, _ := filepath.Glob(filepath.Join(e.dir, "checkpoint", "*.corrupt-*"))
			for _, m := range matches {
				_ = os.Remove(m)
			}
			e.assertClean()
		})
	}
}

// A spec written before specs recorded their reservation still holds its
// devices, whole, until its claim is repaired.
func TestLostCheckpointOldSpecHoldsDevicesWhole(t *testing.T) {
	e := newEnv(t)
	a := claim("a", share("gpu", "gpu-0", "s-1", gib, 0))
	e.prepare(a)
	name := cdispec.SpecName(string(a.UID))
	spec, err := e.opts.CDI.Read(name)
	if err != nil {
		t.Fatal(err)
	}
	delete(spec.Annotations, cdispec.AnnotationReservation)
	if err := e.opts.CDI.Write(name, spec); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(e.dir, "checkpoint", string(a.UID)+".json")); err != nil {
		t.Fatal(err)
	}
	e.apiDown = true
	e.start()
	if _, err := e.p.Prepare(e.ctx, claim("b", share("gpu", "gpu-0", "s-2", gib, 0))); err == nil || !strings.Contains(err.Error(), "oversubscribed") {
		t.Fatalf("a 1 GiB share next to a share of unknown size: %v, want it refused", err)
	}
	if _, err := e.p.Prepare(e.ctx, claim("c", share("gpu", "gpu-1", "s-3", gib, 0))); err != nil {
		t.Fatalf("another GPU is not held: %v", err)
	}
}
