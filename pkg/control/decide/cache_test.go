package decide_test

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	. "github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
)

// TestEngineFollowsSlicesAndClasses: the engine keeps what it derived from
// the slices and classes (catalog, device indexes, CEL results) from one
// cycle to the next; a node republished with other devices, or a class
// replaced with other selectors, must count in the very next cycle.
func TestEngineFollowsSlicesAndClasses(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n0", NodeOptions{Profile: "t4:1"})
	// A cordoned node with a large GPU: the claim's estimate finds a
	// device, so the first cycle looks for one on n0.
	w.node("n1", NodeOptions{Profile: "h100-80gb:1"})
	w.snap.Nodes[1].Spec.Unschedulable = true
	w.queue(Queue("q", "", "", ""))
	big := `device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("40Gi")) >= 0`
	w.template(Template("ns", "big", Request{Selector: big}))

	w.pod("p1", PodOptions{Queue: "q", Templates: []string{"big"}})
	w.cycle()
	expectAdmitted(t, w)
	if v := w.verdict("p1"); v == nil {
		t.Fatal("p1 has no verdict with a 16 GB GPU on the only usable node")
	}

	// The node's plugin republishes: two 80 GB GPUs, in new objects as an
	// informer delivers them.
	republished, err := NodeSlices("n0", NodeOptions{Profile: "h100-80gb:2"})
	if err != nil {
		t.Fatal(err)
	}
	w.snap.Slices = append(republished, w.slices["n1"]...)
	w.cycle()
	expectAdmitted(t, w, "p1")

	// The class is replaced by one that selects no device: a pod like p1
	// waits, although the other GPU is free.
	var classes []*resourceapi.DeviceClass
	for _, dc := range w.snap.Classes {
		if dc.Name == "gpu.tessera.dev" {
			dc = dc.DeepCopy()
			dc.Spec.Selectors = append(dc.Spec.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.attributes["gpu.tessera.dev"].type == "none"`}})
		}
		classes = append(classes, dc)
	}
	w.snap.Classes = classes
	w.pod("p2", PodOptions{Queue: "q", Templates: []string{"big"}})
	w.cycle()
	expectAdmitted(t, w)
	if v := w.verdict("p2"); v == nil {
		t.Fatal("p2 has no verdict with a class that selects nothing")
	}
}
