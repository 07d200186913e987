package controller_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/controller"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
)

// dyingClient lets a controller's first `allow` pod patches of one kind
// through and fails every later one, as a controller killed in the middle
// of a cycle does (it writes nothing more).
type dyingClient struct {
	client.Client
	kind  string // "record": decision annotations (and their rollback); "ungate": gate removals
	mu    sync.Mutex
	allow int
}

func (d *dyingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	data, err := patch.Data(obj)
	if err != nil {
		return err
	}
	kind := "other"
	switch {
	case strings.Contains(string(data), "schedulingGates"):
		kind = "ungate"
	case strings.Contains(string(data), v1alpha1.DecisionAnnotation):
		kind = "record"
	}
	if kind == d.kind {
		d.mu.Lock()
		dead := d.allow <= 0
		d.allow--
		d.mu.Unlock()
		if dead {
			return errors.New("the controller was killed")
		}
	}
	return d.Client.Patch(ctx, obj, patch, opts...)
}

// TestGangAtomicAcrossFaults kills the controller between the patches of a
// gang of 4 on a real API server, once while it records the decision and
// once while it removes the gates, then starts a new controller: the gang
// ends up with all four members admitted under one decision, never with
// some running and the others left to be admitted separately.
func TestGangAtomicAcrossFaults(t *testing.T) {
	e := startEnv(t)
	e.gpuNode("node-1", "h100-80gb:4")
	e.create(decidetest.Queue("team", "", "", ""))

	newReconciler := func(c client.Client) *controller.Reconciler {
		return &controller.Reconciler{
			Client: c, Reader: e.c, Recorder: events.NewFakeRecorder(100),
			Engine:  decide.NewEngine(decide.Config{Reclaim: true, MaxReclaimsPerCycle: 16, Features: allocation.SchedulerFeatures}),
			Metrics: controller.NewMetrics(prometheus.NewRegistry()), Opts: e.opts,
		}
	}
	cycle := func(a *controller.Reconciler) {
		t.Helper()
		if _, err := a.Reconcile(e.ctx, controller.CycleRequest); err != nil {
			t.Fatal(err)
		}
	}
	gang := func(name string) []string {
		var names []string
		for i := range 4 {
			n := fmt.Sprintf("%s-%d", name, i)
			e.create(claim(n+"-gpu", decidetest.Request{Memory: "20Gi"}))
			e.create(asNew(decidetest.Pod("default", n, decidetest.PodOptions{Queue: "team", Gang: name, GangSize: "4", Claims: []string{n + "-gpu"}, Gated: true})))
			names = append(names, n)
		}
		return names
	}
	state := func(names []string) (ungated int, decisions map[string]int) {
		decisions = map[string]int{}
		for _, n := range names {
			p := e.pod(n)
			if !gated(p) {
				ungated++
			}
			if id := p.Annotations[v1alpha1.DecisionAnnotation]; id != "" {
				decisions[id]++
			}
		}
		return ungated, decisions
	}
	for _, tt := range []struct {
		name, kind  string
		allow       int
		wantUngated int
		wantMarked  int // members carrying the dead controller's decision
	}{
		{name: "killed-while-ungating", kind: "ungate", allow: 2, wantUngated: 2, wantMarked: 4},
		{name: "killed-while-recording", kind: "record", allow: 2, wantUngated: 0, wantMarked: 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			names := gang(tt.name)
			cycle(newReconciler(&dyingClient{Client: e.c, kind: tt.kind, allow: tt.allow}))
			ungated, decisions := state(names)
			if ungated != tt.wantUngated || len(decisions) != 1 {
				t.Fatalf("after the fault: %d members ungated, decisions %v; want %d ungated under one decision", ungated, decisions, tt.wantUngated)
			}
			for _, marked := range decisions {
				if marked != tt.wantMarked {
					t.Fatalf("%d members record the decision, want %d", marked, tt.wantMarked)
				}
			}
			// A new controller (fresh engine, nothing remembered) takes over.
			cycle(newReconciler(e.c))
			ungated, decisions = state(names)
			if ungated != 4 || len(decisions) != 1 {
				t.Fatalf("after the restart: %d members ungated, decisions %v; want all 4 under one decision", ungated, decisions)
			}
			for id, marked := range decisions {
				if marked != 4 || !strings.HasSuffix(id, "/4") {
					t.Errorf("decision %s on %d members", id, marked)
				}
			}
			for _, n := range names {
				if p := e.pod(n); p.Annotations[v1alpha1.NodeAnnotation] != "node-1" || pinnedTo(p) != "node-1" {
					t.Errorf("%s: not pinned to its simulated node: annotations %v, affinity %v", n, p.Annotations, p.Spec.Affinity)
				}
			}
			for _, n := range names {
				_ = e.c.Delete(e.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: n}})
			}
		})
	}
}
