package decide_test

import (
	"fmt"
	"testing"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	. "github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
)

// TestOlderPoolGenerationIgnored checks that slices of an older generation
// of a node's pool, still listed while the plugin republishes (e.g. after
// switching MIG mode), add no devices: the scheduler's allocator sees only
// the newest generation, so admitting on the older one over-commits the
// node and leaves a pinned pod unschedulable.
func TestOlderPoolGenerationIgnored(t *testing.T) {
	for _, old := range []NodeOptions{{Profile: "h100-80gb:2", MIG: true}, {Profile: "h100-80gb:2"}} {
		t.Run(fmt.Sprintf("older slices MIG %v", old.MIG), func(t *testing.T) {
			w := newWorld(t, cfg())
			w.node("n1", NodeOptions{Profile: "h100-80gb:2"})
			for _, s := range w.snap.Slices {
				s.Spec.Pool.Generation = 2
			}
			stale, err := NodeSlices("n1", old)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range stale {
				s.Name = "stale-" + s.Name
				s.Spec.Pool.Generation = 1
			}
			w.snap.Slices = append(w.snap.Slices, stale...)
			w.queue(Queue("team", "", "", ""))
			w.template(Template("ns", "gpu", Request{}))
			for i := range 3 {
				w.pod(fmt.Sprintf("p%d", i), PodOptions{Queue: "team", Templates: []string{"gpu"}})
			}
			w.cycle()
			if got := w.admittedNames(); len(got) != 2 {
				t.Fatalf("admitted %v on a node of 2 GPUs (its older slices counted); waiting: %s", got, waiting(w))
			}
			if st := w.status("team"); st == nil {
				t.Error("no status for queue team")
			} else if q := st.Allocated[v1alpha1.ResourceGPUs]; q.String() != "2" {
				t.Errorf("team's allocated GPUs %s, want 2", q.String())
			}
		})
	}
}
