package sim

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
)

// TestAdmissionShortcutsDecideAsExact decides random mixed traces behind
// queues (MIG prioritized lists, shares, whole GPUs with memory
// selectors; every seventh job in a gang of 4) with the admission
// engine's placement shortcuts and without (ExactPlacement), and requires
// the same decisions: the same workloads admitted, on the same nodes, in
// the same order, and the same verdicts for the others.
func TestAdmissionShortcutsDecideAsExact(t *testing.T) {
	groups, _ := ParseNodes("2xdgxh100;2xdgxa100;4xt4:4")
	queues, _ := ParseQueues("inference=256Gi:;training=256Gi:512Gi;notebook=64Gi:128Gi")
	ctx := context.Background()
	seeds := 4
	if testing.Short() {
		seeds = 1
	}
	for seed := range uint64(seeds) {
		for _, p := range []Policy{SharesMIG, Shares, WholeGPU} {
			t.Run(fmt.Sprintf("seed-%d/%s", seed, p), func(t *testing.T) {
				jobs := Generate(300, seed+1, DefaultMix)
				in, err := prepareAdmission(ctx, Cluster{Nodes: groups, Queues: queues}, jobs, p)
				if err != nil {
					t.Fatal(err)
				}
				for i, pod := range in.snap.Pods {
					if g := i / 7; i%7 < 4 && g%3 == 0 {
						pod.Labels[v1alpha1.GangLabel] = fmt.Sprintf("g%d", g)
						pod.Labels[v1alpha1.GangSizeLabel] = "4"
						pod.Labels[v1alpha1.QueueLabel] = in.snap.Pods[g*7].Labels[v1alpha1.QueueLabel]
					}
				}
				decideWith := func(exact bool) *decide.Decision {
					cfg := decide.DefaultConfig()
					cfg.ExactPlacement = exact
					d, err := decide.NewEngine(cfg).Decide(ctx, in.snap)
					if err != nil {
						t.Fatal(err)
					}
					return d
				}
				fast, exact := decideWith(false), decideWith(true)
				if len(exact.Admit) == 0 || len(exact.Waiting) == 0 {
					t.Fatalf("admitted %d, waiting %d: the trace must both admit and hold back", len(exact.Admit), len(exact.Waiting))
				}
				f, e := summarize(fast), summarize(exact)
				for i := range max(len(f), len(e)) {
					if i >= len(f) || i >= len(e) || f[i] != e[i] {
						t.Fatalf("decisions differ at line %d of %d / %d:\nwith shortcuts: %s\nwithout:        %s", i, len(f), len(e), at(f, i), at(e, i))
					}
				}
				if !reflect.DeepEqual(fast.Queues, exact.Queues) {
					t.Errorf("queue status differs:\nwith shortcuts: %+v\nwithout:        %+v", fast.Queues, exact.Queues)
				}
				t.Logf("admitted %d workloads, %d wait; allocator calls %d with shortcuts (%d failures shared), %d without",
					len(exact.Admit), len(exact.Waiting), fast.Stats.AllocatorCalls, fast.Stats.SharedFailures, exact.Stats.AllocatorCalls)
			})
		}
	}
}

// summarize writes a decision as lines: what is admitted (pods, nodes,
// charge, message), evicted and waiting (reason, message), in order.
func summarize(d *decide.Decision) []string {
	var out []string
	for _, a := range d.Admit {
		line := "admit " + a.Workload.Key
		for _, p := range a.Pods {
			line += fmt.Sprintf(" %s@%s", p.Name, a.Nodes[p.UID])
		}
		out = append(out, fmt.Sprintf("%s charge %v: %s", line, a.Charge, a.Message))
	}
	for _, e := range d.Evict {
		out = append(out, fmt.Sprintf("evict %s: %s", e.Workload.Key, e.Message))
	}
	for _, v := range d.Waiting {
		out = append(out, fmt.Sprintf("wait %s %s: %s", v.Workload.Key, v.Reason, v.Message))
	}
	return out
}

func at(lines []string, i int) string {
	if i < len(lines) {
		return lines[i]
	}
	return "(none)"
}
