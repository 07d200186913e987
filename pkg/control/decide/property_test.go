package decide_test

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/catalog"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	. "github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/podclaims"
	"github.com/tessera-dev/tessera/pkg/control/queue"
)

var (
	propertySeeds = flag.Int("property-seeds", 16, "random sequences TestProperty runs")
	propertySteps = flag.Int("property-steps", 100, "steps per sequence")
)

// TestProperty drives random sequences of submissions (pods and gangs, some
// of them bad input), completions, evictions completing, scheduler runs and
// controller restarts, and checks after every cycle that
//   - no queue holds more than its limit, on any level of the hierarchy,
//     counting the real allocation of allocated claims and the estimate of
//     the others;
//   - everything admitted can be placed: whenever no pod is terminating,
//     the scheduler (the same allocator, on its own, binding ungated pods
//     right after each cycle) places every admitted pod, i.e. nothing was
//     admitted beyond what the cluster holds;
//   - gangs are admitted whole;
//   - reclaim does not depend on its victims: pods may have 600 s grace
//     periods (and tenants delete running pods with them), budgets that
//     refuse their eviction, or evictions refused outright; no reclaim
//     plans on an eviction known to be refused (unless past a budget
//     with ReclaimPastBudgets, forced), every pod a cycle evicts ends
//     within the reclaim grace period, and idle capacity is held only for
//     a reclaim that proceeds (checkReclaim).
func TestProperty(t *testing.T) {
	for seed := range *propertySeeds {
		t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) {
			runProperty(t, uint64(seed), *propertySteps)
		})
	}
}

func runProperty(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 42))
	c := cfg()
	c.Reclaim = rng.IntN(4) != 0
	c.ReclaimPastBudgets = rng.IntN(2) == 0
	w := newWorld(t, c)
	// hostile marks a new pod's victim traits: a 600 s grace period, a
	// budget that refuses its eviction while it runs, a webhook that
	// refuses its eviction and deletion.
	hostile := func(p *corev1.Pod) {
		if rng.IntN(3) == 0 {
			p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](600)
		}
		switch rng.IntN(4) {
		case 0, 1:
			w.budgets[p.Name] = true
		case 2:
			w.refuse[p.Name] = true
		}
	}
	profiles := []NodeOptions{{Profile: "h100-80gb:2"}, {Profile: "a100-40gb:2"}, {Profile: "l4:2", TimeSlices: 2}}
	prof := profiles[rng.IntN(len(profiles))]
	for i := range 1 + rng.IntN(3) {
		w.node(fmt.Sprintf("n%d", i), prof)
	}
	w.queue(Queue("org", "", "60Gi", "120Gi"))
	w.queue(Queue("a", "org", "30Gi", "60Gi"))
	w.queue(Queue("b", "org", "30Gi", ""))
	w.queue(Queue("c", "", "", "90Gi"))
	w.queue(Queue("d", "", "40Gi", ""))
	// ext1, ext2 and s4+ext1 ask through the extended resource of
	// gpu.tessera.dev (withTemplate), alone or beside a claim.
	templates := []string{"whole", "s4", "s10", "s20", "two", "ext1", "ext2", "s4+ext1"}
	w.template(Template("ns", "whole", Request{}))
	w.template(Template("ns", "s4", Request{Memory: "4Gi"}))
	w.template(Template("ns", "s10", Request{Memory: "10Gi"}))
	w.template(Template("ns", "s20", Request{Memory: "20Gi"}))
	w.template(Template("ns", "two", Request{Count: 2}))
	if prof.TimeSlices > 0 {
		templates = append(templates, "ts")
		w.template(Template("ns", "ts", Request{Class: "timeslice.tessera.dev"}))
	}
	leaves := []string{"a", "b", "c", "d"}
	seq := 0
	gangs := map[string][]string{} // gangs with members still to submit
	for step := range steps {
		switch op := rng.IntN(10); {
		case op < 4:
			seq++
			q := leaves[rng.IntN(len(leaves))]
			tm := templates[rng.IntN(len(templates))]
			if rng.IntN(3) == 0 {
				// A gang; some members come later.
				size := 2 + rng.IntN(3)
				g := fmt.Sprintf("g%d", seq)
				now := 1 + rng.IntN(size)
				for i := range size {
					name := fmt.Sprintf("%s-%d", g, i)
					if i < now {
						hostile(w.pod(name, withTemplate(PodOptions{Queue: q, Gang: g, GangSize: fmt.Sprint(size)}, tm)))
					} else {
						gangs[g] = append(gangs[g], name+"|"+q+"|"+tm+"|"+fmt.Sprint(size))
					}
				}
			} else {
				qq := q
				if rng.IntN(15) == 0 {
					qq = "org" // bad input: not a leaf
				}
				t.Logf("step %d: submit p%d to %s with %s", step, seq, qq, tm)
				hostile(w.pod(fmt.Sprintf("p%d", seq), withTemplate(PodOptions{Queue: qq}, tm)))
			}
		case op < 5:
			var open []string
			for g := range gangs {
				open = append(open, g)
			}
			sort.Strings(open)
			for _, g := range open {
				rest := gangs[g]
				var name, q, tm, size string
				if _, err := fmt.Sscanf(replaceBars(rest[0]), "%s %s %s %s", &name, &q, &tm, &size); err != nil {
					t.Fatalf("gang member %q: %v", rest[0], err)
				}
				hostile(w.pod(name, withTemplate(PodOptions{Queue: q, Gang: g, GangSize: size}, tm)))
				gangs[g] = rest[1:]
				if len(gangs[g]) == 0 {
					delete(gangs, g)
				}
				break
			}
		case op < 7:
			// Complete a running pod.
			var running []string
			for _, p := range w.snap.Pods {
				if p.Spec.NodeName != "" && p.Status.Phase == "" && p.DeletionTimestamp == nil {
					running = append(running, p.Name)
				}
			}
			if len(running) > 0 {
				n := running[rng.IntN(len(running))]
				if rng.IntN(3) == 0 {
					// The tenant deletes it, with a long grace period.
					t.Logf("step %d: delete %s with a 600 s grace period", step, n)
					w.deleteWith(w.get(n), 600, w.tick())
				} else {
					t.Logf("step %d: finish %s", step, n)
					w.finish(n)
				}
			}
		case op < 8:
			// Evictions complete.
			var gone []string
			for _, p := range w.snap.Pods {
				if p.DeletionTimestamp != nil {
					gone = append(gone, p.Name)
				}
			}
			t.Logf("step %d: remove %v", step, gone)
			w.remove(gone...)
		default:
			t.Logf("step %d: restart", step)
			w.restart(c)
		}
		w.ageRefusals()
		refused := maps.Clone(w.snap.Refused)
		terminating := map[string]bool{}
		for _, p := range w.snap.Pods {
			if p.DeletionTimestamp != nil {
				terminating[p.Name] = true
			}
		}
		w.cycle()
		for _, a := range w.last.Admit {
			t.Logf("step %d: admit %s on %v (%s)", step, a.Workload.Key, a.Nodes, a.Charge)
		}
		for _, e := range w.last.Evict {
			t.Logf("step %d: evict %s (force %v)", step, e.Workload.Key, e.Force)
		}
		checkGangsWhole(t, w, step)
		checkReclaim(t, w, c, refused, terminating, step)
		checkLimits(t, w, step)
		// kube-scheduler binds ungated pods right away; the controller's
		// cycles are slower.
		w.schedule()
		checkPlaceable(t, w, step)
	}
}

// withTemplate sets how the pod asks for devices: "ext<N>" asks N GPUs
// through the implicit extended resource of gpu.tessera.dev, "<t>+ext<N>"
// adds template t, anything else is a template's name.
func withTemplate(o PodOptions, tm string) PodOptions {
	tmpl, ext, _ := strings.Cut(tm, "+")
	if strings.HasPrefix(tmpl, "ext") {
		tmpl, ext = "", tmpl
	}
	if tmpl != "" {
		o.Templates = []string{tmpl}
	}
	if ext != "" {
		o.Extended = map[string]string{ImplicitGPU: strings.TrimPrefix(ext, "ext")}
	}
	return o
}

// checkReclaim: no reclaim plans on an eviction the API refused (a budget
// is passed only by a forced eviction, with ReclaimPastBudgets); every pod
// the cycle evicted (and the API did not refuse) ends within the reclaim
// grace period; and idle
// capacity is held (OverQuotaHeld) only while a reclaim proceeds: it
// evicts this cycle, or waits for workloads that are terminating.
// refused and terminating are the refusals and the terminating pods before
// the cycle.
func checkReclaim(t *testing.T, w *world, c decide.Config, refused map[types.UID]decide.Refusal, terminating map[string]bool, step int) {
	t.Helper()
	limit := w.clock.Add(decide.DefaultReclaimGracePeriod)
	evicting := map[*decide.Workload]bool{}
	for _, e := range w.last.Evict {
		if e.For == nil {
			continue
		}
		evicting[e.For] = true
		for _, p := range e.Pods {
			if r, ok := refused[p.UID]; ok && !terminating[p.Name] && (!r.Budget || !c.ReclaimPastBudgets || !e.Force) {
				t.Fatalf("step %d: reclaim for %s evicts %s, whose eviction was refused (budget %v) at %s", step, e.For.Key, p.Name, r.Budget, r.At)
			}
			if _, refusedNow := w.snap.Refused[p.UID]; !refusedNow && p.DeletionTimestamp != nil && p.DeletionTimestamp.After(limit) {
				t.Fatalf("step %d: %s, evicted for %s, ends by %s, after %s (the reclaim grace period)", step, p.Name, e.For.Key, p.DeletionTimestamp, limit)
			}
		}
	}
	reclaiming := map[*decide.Workload]bool{}
	for _, v := range w.last.Waiting {
		if v.Reason != decide.ReasonReclaiming {
			continue
		}
		reclaiming[v.Workload] = true
		if !evicting[v.Workload] && len(terminating) == 0 {
			t.Fatalf("step %d: %s reclaims, but evicts nothing and nothing is terminating: %s", step, v.Workload.Key, v.Message)
		}
	}
	for _, v := range w.last.Waiting {
		if v.Reason == decide.ReasonOverQuotaHeld && len(reclaiming) == 0 {
			t.Fatalf("step %d: %s is held back (%s) for no reclaim that proceeds", step, v.Workload.Key, v.Message)
		}
	}
}

func replaceBars(s string) string {
	out := []byte(s)
	for i := range out {
		if out[i] == '|' {
			out[i] = ' '
		}
	}
	return string(out)
}

func checkGangsWhole(t *testing.T, w *world, step int) {
	t.Helper()
	for _, a := range w.last.Admit {
		if a.Workload.Gang && len(a.Pods) < a.Workload.Size {
			t.Fatalf("step %d: gang %s admitted with %d of %d members", step, a.Workload.Name, len(a.Pods), a.Workload.Size)
		}
	}
}

// checkLimits recomputes what every queue holds from the world, without
// the engine (chargeWorld), and fails when one holds more than its limit.
func checkLimits(t *testing.T, w *world, step int) {
	t.Helper()
	tree := queue.NewTree(w.snap.Queues)
	chargeWorld(t, w, tree, step)
	for _, q := range tree.Queues {
		for r := range queue.NumResources {
			if q.Limit[r] != queue.NoLimit && q.Allocated[r] > q.Limit[r] {
				t.Fatalf("step %d: queue %s holds %s of %s, limit %s", step, q.Name,
					queue.FormatAmount(queue.Resource(r), q.Allocated[r]), queue.HumanName(queue.Resource(r)), queue.FormatAmount(queue.Resource(r), q.Limit[r]))
			}
		}
	}
}

// chargeWorld charges the queues of tree with what the world's live
// admitted pods hold: their claims, however asked, once each, at the real
// charge of their allocation or the estimate.
func chargeWorld(t *testing.T, w *world, tree *queue.Tree, step int) {
	t.Helper()
	ctx := context.Background()
	cat := catalog.NewCatalog(w.snap.Slices, w.snap.Classes, cel.NewCache(100, cel.Features{}), w.snap.Attributes)
	seen := map[string]bool{}
	objs := worldObjects{w}
	for _, p := range w.snap.Pods {
		if decide.HasAdmissionGate(p) || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		q := tree.Queues[p.Labels[v1alpha1.QueueLabel]]
		if q == nil {
			continue
		}
		pcs, err := podclaims.PodClaims(p, objs)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for _, pc := range pcs {
			if seen[pc.Key] {
				continue
			}
			seen[pc.Key] = true
			var v queue.Vector
			if pc.Allocated() {
				v = cat.ChargeAllocation(pc.Claim.Status.Allocation)
			} else {
				v, err = cat.EstimateClaim(ctx, pc.Display, &pc.Claim.Spec)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
			}
			queue.Charge(q, v)
		}
	}
}

// checkPlaceable: with nothing terminating, every admitted pod got placed
// by the scheduler.
func checkPlaceable(t *testing.T, w *world, step int) {
	t.Helper()
	for _, p := range w.snap.Pods {
		if p.DeletionTimestamp != nil {
			return
		}
	}
	for _, p := range w.snap.Pods {
		if !decide.HasAdmissionGate(p) && p.Status.Phase == "" && p.Spec.NodeName == "" {
			for _, c := range w.snap.Claims {
				if a := c.Status.Allocation; a != nil {
					for _, r := range a.Devices.Results {
						t.Logf("claim %s: %s/%s consumed %v", c.Name, r.Pool, r.Device, r.ConsumedCapacity)
					}
				}
			}
			for _, q := range w.snap.Pods {
				t.Logf("pod %s gated=%v node=%s phase=%s deleting=%v", q.Name, decide.HasAdmissionGate(q), q.Spec.NodeName, q.Status.Phase, q.DeletionTimestamp != nil)
			}
			t.Fatalf("step %d: admitted pod %s does not fit anywhere", step, p.Name)
		}
	}
}

type worldObjects struct{ w *world }

func (o worldObjects) Claim(ns, name string) *resourceClaim {
	for _, c := range o.w.snap.Claims {
		if c.Namespace == ns && c.Name == name {
			return c
		}
	}
	return nil
}

func (o worldObjects) ExtendedResources() *podclaims.ExtendedResources {
	return podclaims.NewExtendedResources(o.w.snap.Classes)
}

func (o worldObjects) Template(ns, name string) *resourceClaimTemplate {
	for _, t := range o.w.snap.Templates {
		if t.Namespace == ns && t.Name == name {
			return t
		}
	}
	return nil
}

type (
	resourceClaim         = resourceapi.ResourceClaim
	resourceClaimTemplate = resourceapi.ResourceClaimTemplate
)
