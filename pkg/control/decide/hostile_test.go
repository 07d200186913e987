package decide_test

import (
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	. "github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
)

var hostileSteps = flag.Int("hostile-steps", 40, "steps per sequence of TestHostileProperty")

// TestHostileProperty drives the random sequences of TestProperty's kind
// with hostile claims mixed in (extreme counts and quantities, selectors
// that fail at run time, invalid specs, see hostileTemplates), in two
// worlds at once, shortcuts on and off, and checks after every cycle that
// no cycle fails or panics, no queue is over its limit, every admitted
// pod is placed, and the two worlds decide alike (admissions, nodes,
// charges, verdict reasons and faults). A third world gets only the good
// submissions: after every cycle the good pods admitted (and where) are
// the same in both, so whatever hostile work is pending, a workload that
// fits is admitted in the same cycle as without it. TestFaultIsolation
// checks one such case by hand.
//
// The seeds take turns over the allocator's feature sets under which
// Tessera's devices can be allocated (FeatureSets: every Kubernetes
// version the controller supports), so the shortcuts are held to the
// exact placement for each.
func TestHostileProperty(t *testing.T) {
	sets := FeatureSets()
	names := slices.Sorted(maps.Keys(sets))
	for seed := range max(*propertySeeds/2, len(names)) {
		name := names[seed%len(names)]
		t.Run(fmt.Sprintf("seed-%d-%s", seed, name), func(t *testing.T) {
			runHostile(t, uint64(seed), *hostileSteps, sets[name])
		})
	}
}

// FuzzHostileCycles runs the hostile sequences from fuzzed seeds:
// go test ./pkg/control/decide -run '^$' -fuzz FuzzHostileCycles -fuzztime 5m
func FuzzHostileCycles(f *testing.F) {
	f.Add(uint64(1), uint8(20))
	f.Add(uint64(7), uint8(60))
	f.Fuzz(func(t *testing.T, seed uint64, steps uint8) {
		runHostile(t, seed, int(steps)%80+1, allocation.SchedulerFeatures)
	})
}

// runHostile runs one hostile sequence of TestHostileProperty.
func runHostile(t *testing.T, seed uint64, steps int, features structured.Features) {
	rng := rand.New(rand.NewPCG(seed, 7))
	hostile := hostileTemplates()
	var hostileNames []string
	for n := range hostile {
		hostileNames = append(hostileNames, n)
	}
	for n, bad := range hostileExtended {
		if bad {
			hostileNames = append(hostileNames, n)
		}
	}
	sort.Strings(hostileNames)
	// worlds[0] and [1]: shortcuts on and off; worlds[2]: the good
	// submissions only.
	worlds := make([]*world, 3)
	for i := range worlds {
		c := cfg()
		c.ExactPlacement = i == 1
		c.Features = features
		w := newWorld(t, c)
		w.node("n0", NodeOptions{Profile: "h100-80gb:2"})
		w.node("n1", NodeOptions{Profile: "l4:2", TimeSlices: 2})
		w.queue(Queue("a", "", "20Gi", "40Gi"))
		w.queue(Queue("b", "", "", "10Gi"))
		w.queue(Queue("zero", "", "", "0"))
		w.template(Template("ns", "s4", Request{Memory: "4Gi"}))
		w.template(Template("ns", "whole", Request{}))
		for _, n := range hostileNames {
			if t := hostile[n]; t != nil {
				w.template(t)
			}
		}
		worlds[i] = w
	}
	leaves := []string{"a", "b", "zero"}
	seq := 0
	for step := range steps {
		op := rng.IntN(10)
		q := leaves[rng.IntN(len(leaves))]
		tm := hostileNames[rng.IntN(len(hostileNames))]
		if op < 4 {
			tm = []string{"s4", "whole", "ext1", "s4+ext1", "ext-no-class", "ext-device-plugin"}[rng.IntN(6)]
		}
		var finish string
		if op >= 8 {
			for _, p := range worlds[0].snap.Pods {
				if p.Spec.NodeName != "" && p.Status.Phase == "" {
					finish = p.Name
					break
				}
			}
		}
		seq++
		_, bad := hostile[tm]
		opts := PodOptions{Queue: q, Templates: []string{tm}}
		if ext, ok := extendedRequests[tm]; ok {
			bad, opts = hostileExtended[tm], PodOptions{Queue: q, Extended: ext}
		} else if !bad {
			opts = withTemplate(PodOptions{Queue: q}, tm)
		}
		for i, w := range worlds {
			if finish != "" {
				w.finish(finish)
			} else if i < 2 || !bad {
				w.pod(fmt.Sprintf("p%d", seq), opts)
			}
			w.cycle()
			checkLimits(t, w, step)
			w.schedule()
			checkPlaceable(t, w, step)
		}
		if a, b := decisionString(worlds[0].last), decisionString(worlds[1].last); a != b {
			t.Fatalf("step %d: shortcuts decide\n%s\nexact placement decides\n%s", step, a, b)
		}
		if a, b := admissionsString(worlds[0].last), admissionsString(worlds[2].last); a != b {
			t.Fatalf("step %d: with hostile work pending the cycle admits\n%s\nwithout it\n%s", step, a, b)
		}
	}
}

// extendedRequests are requests through extended resources a tenant may
// write: more devices than any node has (beyond the allocator's per-claim
// maximum too), and two that get no device through DRA (a class that does
// not exist, a device plugin's name no class serves: such pods hold
// nothing of Tessera's and are admitted at once, in every world).
var extendedRequests = map[string]map[string]string{
	"ext-huge":          {ImplicitGPU: "64"},
	"ext-many":          {ImplicitGPU: "3"},
	"ext-no-class":      {"deviceclass.resource.kubernetes.io/nosuchclass": "1"},
	"ext-device-plugin": {"example.com/fpga": "1"},
}

// hostileExtended says which of extendedRequests only the hostile worlds get.
var hostileExtended = map[string]bool{"ext-huge": true, "ext-many": true, "ext-no-class": false, "ext-device-plugin": false}

// admissionsString renders a cycle's admissions with their nodes.
func admissionsString(d *decide.Decision) string {
	var lines []string
	for _, a := range d.Admit {
		nodes := admittedNodes(a)
		sort.Strings(nodes)
		lines = append(lines, fmt.Sprintf("admit %s %v", a.Workload.Key, nodes))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// decisionString renders what a cycle decided: admissions with their
// nodes, verdicts with their reasons and faults.
func decisionString(d *decide.Decision) string {
	var lines []string
	for _, a := range d.Admit {
		lines = append(lines, fmt.Sprintf("admit %s %v %s", a.Workload.Key, admittedNodes(a), a.Charge))
	}
	for _, v := range d.Waiting {
		lines = append(lines, fmt.Sprintf("wait %s %s %s", v.Workload.Key, v.Reason, v.Fault))
	}
	sort.Strings(lines)
	return fmt.Sprint(lines)
}

// admittedNodes are an admission's pods with their nodes, pod@node, in the
// order of its pods.
func admittedNodes(a *decide.Admission) []string {
	var nodes []string
	for _, p := range a.Pods {
		nodes = append(nodes, p.Name+"@"+a.Nodes[p.UID])
	}
	return nodes
}
