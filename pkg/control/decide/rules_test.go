package decide_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	. "github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/queue"
)

// TestQueueChangesProperty drives random sequences in which the queues
// change between a pod's creation and its admission (a queue created after
// pods name it, a namespaceSelector narrowed and widened, a namespace
// relabelled, a queue moved under another parent) while pods ask through
// templates and extended resources, in gangs too, and checks after every
// cycle that every workload admitted in it was admitted into a queue that
// exists, is a leaf, selects the pod's namespace as it is labelled now,
// and that no queue on its path went over its limit by it.
func TestQueueChangesProperty(t *testing.T) {
	for seed := range *propertySeeds {
		t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) {
			runQueueChanges(t, uint64(seed), *propertySteps)
		})
	}
}

func runQueueChanges(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 99))
	w := newWorld(t, cfg())
	w.node("n0", NodeOptions{Profile: "h100-80gb:2"})
	w.node("n1", NodeOptions{Profile: "l4:2"})
	namespaces := []string{"ns-a", "ns-b"}
	teams := []string{"a", "b", "c"}
	for i, ns := range namespaces {
		w.namespace(ns, map[string]string{"team": teams[i]})
	}
	selector := func(team string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"team": team}}
	}
	w.queue(Queue("org1", "", "", "60Gi"))
	w.queue(Queue("org2", "", "", "20Gi"))
	open := Queue("open", "org1", "", "")
	w.queue(open)
	onlyA := Queue("only-a", "org1", "", "40Gi")
	onlyA.Spec.NamespaceSelector = selector("a")
	w.queue(onlyA)
	moving := Queue("moving", "org1", "", "")
	w.queue(moving)
	w.template(Template("ns-a", "s10", Request{Memory: "10Gi"}))
	w.template(Template("ns-b", "s10", Request{Memory: "10Gi"}))
	w.template(Template("ns-a", "whole", Request{}))
	w.template(Template("ns-b", "whole", Request{}))
	leaves := []string{"open", "only-a", "moving", "late"}
	asks := []string{"s10", "whole", "ext1", "s10+ext1"}
	lateCreated := false
	seq, admitted, refused := 0, 0, 0
	for step := range steps {
		switch op := rng.IntN(12); {
		case op < 5:
			seq++
			ns := namespaces[rng.IntN(len(namespaces))]
			o := withTemplate(PodOptions{Queue: leaves[rng.IntN(len(leaves))]}, asks[rng.IntN(len(asks))])
			if rng.IntN(4) == 0 {
				g := fmt.Sprintf("g%d", seq)
				for i := range 2 {
					o.Gang, o.GangSize = g, "2"
					w.podIn(ns, fmt.Sprintf("%s-%d", g, i), o)
				}
			} else {
				w.podIn(ns, fmt.Sprintf("p%d", seq), o)
			}
		case op < 6 && !lateCreated:
			late := Queue("late", "org2", "", "")
			late.Spec.NamespaceSelector = selector(teams[rng.IntN(len(teams))])
			w.queue(late)
			lateCreated = true
			t.Logf("step %d: queue late created for team %s", step, late.Spec.NamespaceSelector.MatchLabels["team"])
		case op < 7:
			onlyA.Spec.NamespaceSelector = selector(teams[rng.IntN(len(teams))])
			t.Logf("step %d: only-a now takes team %s", step, onlyA.Spec.NamespaceSelector.MatchLabels["team"])
		case op < 8:
			ns := namespaces[rng.IntN(len(namespaces))]
			team := teams[rng.IntN(len(teams))]
			w.namespace(ns, map[string]string{"team": team})
			t.Logf("step %d: %s relabelled team=%s", step, ns, team)
		case op < 9:
			moving.Spec.Parent = []string{"org1", "org2"}[rng.IntN(2)]
			t.Logf("step %d: moving now under %s", step, moving.Spec.Parent)
		case op < 11:
			var running []string
			for _, p := range w.snap.Pods {
				if p.Spec.NodeName != "" && p.Status.Phase == "" {
					running = append(running, p.Name)
				}
			}
			if len(running) > 0 {
				w.finish(running[rng.IntN(len(running))])
			}
		default:
			w.restart(cfg())
		}
		w.cycle()
		checkAdmittedByRules(t, w, step)
		admitted += len(w.last.Admit)
		for _, v := range w.last.Waiting {
			if v.Reason == decide.ReasonNamespaceNotSelected {
				refused++
			}
		}
		w.schedule()
	}
	// The sequence exercised both sides of the rule.
	if steps >= 50 && (admitted == 0 || refused == 0) {
		t.Fatalf("%d admissions and %d namespace refusals in %d steps: the sequence tests nothing", admitted, refused, steps)
	}
}

// checkAdmittedByRules checks the workloads the last cycle admitted
// against the queues and namespaces as they are now.
func checkAdmittedByRules(t *testing.T, w *world, step int) {
	t.Helper()
	tree := queue.NewTree(w.snap.Queues)
	labels := map[string]map[string]string{}
	for _, ns := range w.snap.Namespaces {
		labels[ns.Name] = ns.Labels
	}
	chargeWorld(t, w, tree, step)
	for _, a := range w.last.Admit {
		for _, p := range a.Pods {
			name := p.Labels[v1alpha1.QueueLabel]
			q := tree.Queues[name]
			switch {
			case q == nil:
				t.Fatalf("step %d: pod %s admitted into queue %s, which does not exist", step, p.Name, name)
			case !q.IsLeaf() || q.Invalid != "":
				t.Fatalf("step %d: pod %s admitted into queue %s, which cannot take workloads", step, p.Name, name)
			}
			if msg := q.RefusesNamespace(p.Namespace, labels[p.Namespace]); msg != "" {
				t.Fatalf("step %d: pod %s admitted although %s", step, p.Name, msg)
			}
			for n := q; n != nil; n = n.Parent {
				for r := range queue.NumResources {
					if n.Limit[r] != queue.NoLimit && n.Allocated[r] > n.Limit[r] {
						t.Fatalf("step %d: admitting pod %s put queue %s over its limit (%d > %d)", step, p.Name, n.Name, n.Allocated[r], n.Limit[r])
					}
				}
			}
		}
	}
}

// TestQueueRulesWaitCondition: the verdict a pod gets when its queue stops
// taking its namespace names the queue, the selector and the namespace,
// never another tenant's.
func TestQueueRulesWaitCondition(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:1"})
	w.namespace("tenant", map[string]string{"team": "x"})
	q := Queue("q", "", "", "")
	q.Spec.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: metav1.LabelSelectorOpIn, Values: []string{"y", "z"}}}}
	w.queue(q)
	w.podIn("tenant", "p", PodOptions{Queue: "q", Extended: map[string]string{ImplicitGPU: "1"}})
	w.cycle()
	v := w.verdict("p")
	if v == nil || v.Reason != decide.ReasonNamespaceNotSelected || v.Invalid {
		t.Fatalf("verdict %+v", v)
	}
	want := "pod p: queue q takes pods only from namespaces matching its namespaceSelector \"team in (y,z)\"; namespace tenant does not match: use a queue meant for this namespace"
	if v.Message != want {
		t.Errorf("message %q\nwant %q", v.Message, want)
	}
	if got := w.status("q").PendingWorkloads; got != 1 {
		t.Errorf("pending workloads %d, want 1 (it waits in its queue)", got)
	}
}
