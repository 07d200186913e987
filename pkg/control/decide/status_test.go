package decide_test

import (
	"context"
	"testing"

	apiequality "k8s.io/apimachinery/pkg/api/equality"

	. "github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
)

// TestStatusMatchesDecide checks that the status refresh (Engine.Status),
// which places nothing, reports what a full cycle reports on the same
// snapshot, at every step of a workload's life, and that it admits nothing
// and leaves the engine's reservations alone.
func TestStatusMatchesDecide(t *testing.T) {
	steps := []struct {
		name string
		do   func(w *world)
		// gated: a pod is left pending; the refresh counts it and a full
		// cycle (run after the comparison) would admit it.
		gated bool
		// allocA and allocB are the memory Status charges team-a and team-b.
		allocA, allocB string
	}{
		{"admitted, not yet allocated (reservations)", func(w *world) {}, false, "12Gi", "8Gi"},
		{"allocated by the scheduler", func(w *world) { w.schedule() }, false, "12Gi", "8Gi"},
		{"one pod ended", func(w *world) { w.finish("p1") }, false, "0", "8Gi"},
		{"restarted: admitted claims without reservation are estimated", func(w *world) {
			w.pod("p3", PodOptions{Queue: "team-b", Templates: []string{"share8"}})
			w.cycle()
			w.restart(cfg())
		}, false, "0", "16Gi"},
		{"a pod gated", func(w *world) {
			w.pod("p4", PodOptions{Queue: "team-a", Templates: []string{"share8"}})
		}, true, "0", "16Gi"},
	}
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:2"})
	w.queue(Queue("team-a", "", "32Gi", ""))
	w.queue(Queue("team-b", "", "16Gi", ""))
	w.template(Template("ns", "share12", Request{Memory: "12Gi"}))
	w.template(Template("ns", "share8", Request{Memory: "8Gi"}))
	w.pod("p1", PodOptions{Queue: "team-a", Templates: []string{"share12"}})
	w.pod("p2", PodOptions{Queue: "team-b", Templates: []string{"share8"}})
	w.cycle()
	expectAdmitted(t, w, "p1", "p2")
	ctx := context.Background()
	for _, s := range steps {
		s.do(w)
		st, err := w.eng.Status(ctx, &w.snap)
		if err != nil {
			t.Fatalf("%s: Status: %v", s.name, err)
		}
		if a, b := mem(st.Queues["team-a"], "allocated"), mem(st.Queues["team-b"], "allocated"); a != s.allocA || b != s.allocB {
			t.Errorf("%s: Status allocated team-a %s, team-b %s; want %s, %s", s.name, a, b, s.allocA, s.allocB)
		}
		// Status admitted nothing: the next cycle still sees p4 pending
		// and admits it, and the snapshot's pods are untouched.
		d := w.cycle()
		if s.gated {
			if len(d.Admit) != 1 || d.Admit[0].Pods[0].Name != "p4" {
				t.Fatalf("%s: cycle after Status admitted %v, want p4", s.name, w.admittedNames())
			}
			if got := st.Queues["team-a"].PendingWorkloads; got != 1 {
				t.Errorf("%s: Status counts %d pending in team-a, want 1", s.name, got)
			}
			if got := mem(st.Queues["team-a"], "pending"); got != "8Gi" {
				t.Errorf("%s: Status pending memory %s in team-a, want 8Gi", s.name, got)
			}
			continue
		}
		if len(d.Admit) != 0 {
			t.Fatalf("%s: nothing gated, yet the cycle admitted %v", s.name, w.admittedNames())
		}
		for q, want := range d.Queues {
			if got := st.Queues[q]; !apiequality.Semantic.DeepEqual(got, want) {
				t.Errorf("%s: queue %s: Status\n%+v\nDecide\n%+v", s.name, q, got, want)
			}
		}
		if len(st.Queues) != len(d.Queues) {
			t.Errorf("%s: Status has %d queues, Decide %d", s.name, len(st.Queues), len(d.Queues))
		}
	}
}
