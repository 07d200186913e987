package prepare

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/node/mig"
	"github.com/tessera-dev/tessera/pkg/node/timeslice"
)

// TestReasonOfRealFailures prepares claims that fail through the real
// prepare code and checks the Reason each failure carries (the plugin's
// metric label), and that the message is the one users read.
func TestReasonOfRealFailures(t *testing.T) {
	lib := t.TempDir() + "/libvgpu.so"
	holder := func(e *env) { e.prepare(claim("a", share("gpu", "gpu-0", "s-1", 10*gib, 0))) }
	tests := []struct {
		name   string
		opts   []envOption
		before func(*env) // what is prepared or made first
		claim  *resourceapi.ResourceClaim
		want   Reason
		msg    string
	}{
		{name: "oversubscribed", before: holder,
			claim: claim("b", share("gpu", "gpu-0", "s-2", 10*gib, 0)), want: ReasonConflict, msg: "would be oversubscribed"},
		{name: "share prepared twice", before: holder,
			claim: claim("b", share("gpu", "gpu-0", "s-1", gib, 0)), want: ReasonConflict, msg: "share s-1 is already prepared"},
		{name: "time slice next to a share", opts: []envOption{withTimeSlices(2)}, before: holder,
			claim: claim("b", device("ts", "gpu-0-ts-1")), want: ReasonConflict, msg: "carries a share"},
		{name: "time slice prepared twice", opts: []envOption{withTimeSlices(2)},
			before: func(e *env) { e.prepare(claim("a", device("ts", "gpu-1-ts-0"))) },
			claim:  claim("b", device("ts", "gpu-1-ts-0")), want: ReasonConflict, msg: "already prepared for claim ns/a"},
		{name: "time-slice interval", opts: []envOption{withTimeSlices(4)},
			before: func(e *env) {
				e.prepare(withConfig(claim("a", device("ts", "gpu-0-ts-0")), resourceapi.AllocationConfigSourceClaim, nil, `"timeSliceInterval":"Short"`))
			},
			claim: withConfig(claim("b", device("ts", "gpu-0-ts-1")), resourceapi.AllocationConfigSourceClaim, nil, `"timeSliceInterval":"Long"`),
			want:  ReasonConflict, msg: "time-slice interval conflict"},
		{name: "static MIG device missing", opts: []envOption{withMIG(), staticMIG},
			before: func(e *env) {
				// Published, then destroyed behind the plugin's back.
				inst := createMIG(e, "2g.10gb", 4)
				if err := e.opts.MIG.Destroy(e.ctx, inst); err != nil {
					e.t.Fatal(err)
				}
			},
			claim: claim("b", device("mig", "gpu-0-mig-2g10gb-4")), want: ReasonMIG, msg: "does not exist (any more)"},
		{name: "MIG placement taken outside Tessera", opts: []envOption{withMIG()},
			before: func(e *env) { createMIG(e, "2g.10gb", 4) },
			claim:  claim("b", device("mig", "gpu-0-mig-2g10gb-4")), want: ReasonMIG, msg: "which Tessera did not create"},
		{name: "below the class's floor", opts: []envOption{withInterposer(lib)},
			claim: withConfig(withConfig(claim("b", share("gpu", "gpu-0", "s-1", gib, 0)),
				resourceapi.AllocationConfigSourceClass, nil, `"minEnforcement":"interposer"`),
				resourceapi.AllocationConfigSourceClaim, nil, `"enforcement":"none"`),
			want: ReasonEnforcement, msg: "is weaker than the floor"},
		{name: "node cannot deliver its floor", opts: []envOption{nodeFloorInterposer},
			claim: claim("b", share("gpu", "gpu-0", "s-1", gib, 0)), want: ReasonEnforcement, msg: "cannot be delivered"},
		{name: "claim sets the floor",
			claim: withConfig(claim("b", share("gpu", "gpu-0", "s-1", gib, 0)), resourceapi.AllocationConfigSourceClaim, nil, `"minEnforcement":"none"`),
			want:  ReasonConfig, msg: "only a DeviceClass's configuration may set the enforcement floor"},
		{name: "unknown interval",
			claim: withConfig(claim("b", share("gpu", "gpu-0", "s-1", gib, 0)), resourceapi.AllocationConfigSourceClass, nil, `"timeSliceInterval":"Forever"`),
			want:  ReasonConfig, msg: "timeSliceInterval"},
		{name: "device not published",
			claim: claim("b", share("gpu", "gpu-7", "s-1", gib, 0)), want: ReasonOther, msg: "does not publish device gpu-7"},
		{name: "not allocated",
			claim: func() *resourceapi.ResourceClaim {
				c := claim("b", share("gpu", "gpu-0", "s-1", gib, 0))
				c.Status.Allocation = nil
				return c
			}(), want: ReasonOther, msg: "is not allocated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.opts...)
			if tt.before != nil {
				tt.before(e)
			}
			_, err := e.p.Prepare(e.ctx, tt.claim)
			if err == nil {
				t.Fatalf("prepared; want a %s failure", tt.want)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q lacks %q", err, tt.msg)
			}
			if got := ReasonOf(err); got != tt.want {
				t.Errorf("ReasonOf(%q) = %s, want %s", err, got, tt.want)
			}
			// What the plugin adds around it keeps the reason.
			if got := ReasonOf(fmt.Errorf("prepare claim ns/b: %w", err)); got != tt.want {
				t.Errorf("wrapped: %s, want %s", got, tt.want)
			}
		})
	}
}

func TestReasonErrorKeepsTheMessageAndChain(t *testing.T) {
	inner := &timeslice.Conflict{GPU: "GPU-x", Requester: "ns/b"}
	err := withReason(ReasonConfig, inner)
	var c *timeslice.Conflict
	if err.Error() != inner.Error() || !errors.As(err, &c) {
		t.Errorf("message %q or chain changed", err)
	}
	if withReason(ReasonConfig, nil) != nil {
		t.Error("nil wrapped into an error")
	}
	if got := ReasonOf(errors.New("x")); got != ReasonOther {
		t.Errorf("plain error: %s", got)
	}
}

func staticMIG(e *env) { e.cfg.MIGMode = "static" }

func nodeFloorInterposer(e *env) { e.opts.Enforce.MinEnforcement = "interposer" }

// createMIG makes a MIG instance outside Tessera and rediscovers the node.
func createMIG(e *env, profile string, start int) mig.Instance {
	e.t.Helper()
	gpu := e.inv.GPUs[0]
	var prof inventory.MIGProfile
	for _, p := range gpu.MIGProfiles {
		if p.Name == profile {
			prof = p
		}
	}
	tmpl, err := mig.Template(gpu, prof, start)
	if err != nil {
		e.t.Fatal(err)
	}
	unlock := e.opts.MIG.Lock(gpu.UUID)
	inst, err := e.opts.MIG.Create(e.ctx, tmpl, nil)
	unlock()
	if err != nil {
		e.t.Fatal(err)
	}
	e.start()
	return *inst
}
