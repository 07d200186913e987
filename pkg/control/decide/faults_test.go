package decide_test

import (
	"fmt"
	"math"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-dev/tessera/pkg/control/decide"
	. "github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

// hostileTemplates are claims the scheduler can never allocate, by the
// fault the engine reports for them.
func hostileTemplates() map[string]*resourceapi.ResourceClaimTemplate {
	out := map[string]*resourceapi.ResourceClaimTemplate{
		// Fail at run time on every device: a missing attribute, a
		// division by zero.
		"missing-attr": Template("ns", "missing-attr", Request{Selector: `device.attributes["gpu.tessera.dev"].nosuch > 1`}),
		"div-zero":     Template("ns", "div-zero", Request{Selector: `1 / (device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("0")) - 1) == 1`}),
		"no-compile":   Template("ns", "no-compile", Request{Selector: `device.attributes[`}),
	}
	big := Template("ns", "count-big", Request{})
	big.Spec.Spec.Devices.Requests[0].Exactly.Count = math.MaxInt64
	out["count-big"] = big
	negative := Template("ns", "count-negative", Request{})
	negative.Spec.Spec.Devices.Requests[0].Exactly.Count = -3
	out["count-negative"] = negative
	huge := Template("ns", "capacity-huge", Request{Memory: "1Gi"})
	huge.Spec.Spec.Devices.Requests[0].Exactly.Capacity.Requests[devicemodel.CapMemory] = resource.MustParse("1e30")
	out["capacity-huge"] = huge
	neg := Template("ns", "capacity-negative", Request{Memory: "1Gi"})
	neg.Spec.Spec.Devices.Requests[0].Exactly.Capacity.Requests[devicemodel.CapMemory] = resource.MustParse("-1Gi")
	out["capacity-negative"] = neg
	nocel := Template("ns", "no-cel", Request{})
	nocel.Spec.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{}}
	out["no-cel"] = nocel
	empty := Template("ns", "empty-request", Request{})
	empty.Spec.Spec.Devices.Requests[0].Exactly = nil
	out["empty-request"] = empty
	mode := Template("ns", "bad-mode", Request{})
	mode.Spec.Spec.Devices.Requests[0].Exactly.AllocationMode = "Most"
	out["bad-mode"] = mode
	return out
}

var hostileFaults = map[string]string{
	"missing-attr":      decide.FaultSelector,
	"div-zero":          decide.FaultSelector,
	"no-compile":        decide.FaultSelector,
	"count-big":         decide.FaultCount,
	"count-negative":    decide.FaultCount,
	"capacity-huge":     decide.FaultCapacity,
	"capacity-negative": decide.FaultCapacity,
	"no-cel":            decide.FaultSpec,
	"empty-request":     decide.FaultSpec,
	"bad-mode":          decide.FaultSpec,
}

// TestFaultIsolation: every claim the allocator refuses makes its own
// workload inadmissible with a fault, and a good pod in another queue is
// admitted in the same cycle, with the shortcuts on and off. A selector
// failing at run time never counts as a match: none of those pods is
// admitted although the GPUs are free.
func TestFaultIsolation(t *testing.T) {
	for _, exact := range []bool{false, true} {
		t.Run(fmt.Sprintf("exact=%v", exact), func(t *testing.T) {
			c := cfg()
			c.ExactPlacement = exact
			w := newWorld(t, c)
			w.node("n1", NodeOptions{Profile: "h100-80gb:2"})
			w.queue(Queue("a", "", "", ""))
			w.queue(Queue("b", "", "", "1Gi"))
			for name, tm := range hostileTemplates() {
				w.template(tm)
				w.pod("bad-"+name, PodOptions{Queue: "a", Templates: []string{name}})
			}
			w.template(Template("ns", "s256", Request{Memory: "256Mi"}))
			w.pod("good", PodOptions{Queue: "b", Templates: []string{"s256"}})
			w.cycle()
			expectAdmitted(t, w, "good")
			for name, fault := range hostileFaults {
				v := w.verdict("bad-" + name)
				if v == nil || !v.Invalid || v.Fault != fault || v.Reason != decide.ReasonInvalid {
					t.Errorf("bad-%s: verdict %+v, want fault %s", name, v, fault)
					continue
				}
				if !strings.Contains(v.Message, "bad-"+name) || strings.Contains(v.Message, "other-ns") {
					t.Errorf("bad-%s: message %q", name, v.Message)
				}
			}
			if got := w.last.Stats.Invalid; got != len(hostileFaults) {
				t.Errorf("%d invalid, want %d", got, len(hostileFaults))
			}
		})
	}
}

// TestFailingSelectorNeverMatches: a selector that fails on one device
// and matches another. The allocator meets the failing device first (it
// is free) and reports the error, so kube-scheduler never places the pod;
// the shortcuts must not place it on the other device either.
func TestFailingSelectorNeverMatches(t *testing.T) {
	for _, exact := range []bool{false, true} {
		t.Run(fmt.Sprintf("exact=%v", exact), func(t *testing.T) {
			c := cfg()
			c.ExactPlacement = exact
			w := newWorld(t, c)
			w.node("n1", NodeOptions{Profile: "h100-80gb:2"})
			w.queue(Queue("a", "", "", ""))
			// index 0 has no attribute "x": the map access fails there; on
			// other devices the selector is plain false || true.
			sel := `device.attributes["gpu.tessera.dev"].index == 0 ? device.attributes["gpu.tessera.dev"].x == 1 : true`
			w.template(Template("ns", "half", Request{Selector: sel}))
			w.pod("p1", PodOptions{Queue: "a", Templates: []string{"half"}})
			w.pod("p2", PodOptions{Queue: "a", Templates: []string{"half"}})
			w.cycle()
			expectAdmitted(t, w)
			for _, p := range []string{"p1", "p2"} {
				if v := w.verdict(p); v == nil || v.Fault != decide.FaultSelector {
					t.Errorf("%s: verdict %+v, want %s", p, v, decide.FaultSelector)
				}
			}
		})
	}
}
