package decide_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/control/decide"
	. "github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
)

// TestReclaimProperty drives sequences built to make reclaim work hard:
// two queues guaranteed a GPU each and two borrowers without quota that
// fill the GPUs first, every pod with victim traits (600 s grace periods,
// budgets, evictions refused outright), tenants deleting their own pods
// with long grace periods, refusals ageing out, controller restarts. After
// every cycle it checks what TestProperty checks, reclaim included
// (checkReclaim), with budgets passed (ReclaimPastBudgets) and honoured.
func TestReclaimProperty(t *testing.T) {
	for seed := range *propertySeeds {
		t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) {
			runReclaimProperty(t, uint64(seed), *propertySteps)
		})
	}
}

// runReclaimProperty runs one sequence of TestReclaimProperty.
func runReclaimProperty(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 99))
	c := cfg()
	c.ReclaimPastBudgets = seed%2 == 0
	w := newWorld(t, c)
	for i := range 1 + rng.IntN(2) {
		w.node(fmt.Sprintf("n%d", i), NodeOptions{Profile: "h100-80gb:2"})
	}
	w.queue(Queue("q1", "", "80Gi", ""))
	w.queue(Queue("q2", "", "80Gi", ""))
	w.queue(Queue("x", "", "", ""))
	w.queue(Queue("y", "", "", ""))
	templates := []string{"whole", "s20", "s40"}
	w.template(Template("ns", "whole", Request{}))
	w.template(Template("ns", "s20", Request{Memory: "20Gi"}))
	w.template(Template("ns", "s40", Request{Memory: "40Gi"}))
	forced, refusals := 0, 0
	for step := range steps {
		switch op := rng.IntN(12); {
		case op < 5:
			q := []string{"x", "y", "x", "y", "q1", "q2"}[rng.IntN(6)]
			if step > steps/3 {
				q = []string{"x", "y", "q1", "q2"}[rng.IntN(4)]
			}
			name := fmt.Sprintf("p%d", step)
			p := w.pod(name, PodOptions{Queue: q, Templates: []string{templates[rng.IntN(len(templates))]}, Priority: int32(rng.IntN(2))})
			if rng.IntN(2) == 0 {
				p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](600)
			}
			switch rng.IntN(4) {
			case 0, 1:
				w.budgets[name] = true
			case 2:
				w.refuse[name] = true
			}
		case op < 7:
			var running []string
			for _, p := range w.snap.Pods {
				if p.Spec.NodeName != "" && p.Status.Phase == "" && p.DeletionTimestamp == nil {
					running = append(running, p.Name)
				}
			}
			if len(running) > 0 {
				n := running[rng.IntN(len(running))]
				if op == 5 {
					w.deleteWith(w.get(n), 600, w.tick())
				} else {
					w.finish(n)
				}
			}
		case op < 9:
			// Terminating pods whose deadline passed stop; their claims
			// are released now, or (op 8) a moment later.
			var gone []string
			for _, p := range w.snap.Pods {
				if p.DeletionTimestamp != nil && !p.DeletionTimestamp.After(w.clock) && p.Status.Phase == "" {
					gone = append(gone, p.Name)
				}
			}
			if op == 7 {
				w.remove(gone...)
			} else {
				w.stop(gone...)
			}
		case op < 10:
			w.clock = w.clock.Add(refusalTTL / 2)
		case op < 11:
			w.clock = w.clock.Add(decide.DefaultReclaimGracePeriod)
		default:
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
		before := w.forced
		w.cycle()
		forced += w.forced - before
		for _, r := range w.snap.Refused {
			if r.At.Equal(w.clock) {
				refusals++
			}
		}
		checkGangsWhole(t, w, step)
		checkReclaim(t, w, c, refused, terminating, step)
		checkLimits(t, w, step)
		w.schedule()
		checkPlaceable(t, w, step)
	}
	t.Logf("%d evictions refused, %d pods deleted past their budget", refusals, forced)
}
