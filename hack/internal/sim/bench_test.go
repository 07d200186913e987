package sim

import (
	"context"
	"slices"
	"testing"

	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/test/testutil"
)

// BenchmarkMixedTrace replays 100 jobs of the mixed trace on a small
// heterogeneous cluster under Tessera shares.
func BenchmarkMixedTrace(b *testing.B) {
	nodes, _ := ParseNodes("2xdgxh100;2xdgxa100;4xt4:4")
	jobs := Generate(100, 1, DefaultMix)
	for b.Loop() {
		if _, err := Run(context.Background(), Cluster{Nodes: nodes}, jobs, Shares); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAdmissionCycleMIG decides the 1,000 jobs of the mixed trace
// behind queues in one admission cycle, with shares and with shares + MIG
// (prioritized lists), in the same run: the target is MIG within 3x.
// Each policy runs from a fresh engine (the first cycle) and again with
// one engine (the next cycle, slices and classes unchanged), which must
// admit the same pods.
func BenchmarkAdmissionCycleMIG(b *testing.B) {
	jobs, err := ReadCSV(testutil.Path(b, "hack", "sim", "traces", "mixed-1000.csv"))
	if err != nil {
		b.Fatal(err)
	}
	groups, _ := ParseNodes("12xdgxh100;12xdgxa100;40xt4:4")
	queues, _ := ParseQueues("inference=1Ti:;training=1Ti:2Ti;notebook=256Gi:512Gi")
	ctx := context.Background()
	for _, p := range []Policy{Shares, SharesMIG} {
		in, err := prepareAdmission(ctx, Cluster{Nodes: groups, Queues: queues}, jobs, p)
		if err != nil {
			b.Fatal(err)
		}
		var first admissionResult
		b.Run(string(p), func(b *testing.B) {
			for b.Loop() {
				if first, err = in.admit(ctx); err != nil {
					b.Fatal(err)
				}
			}
			reportCycle(b, first)
		})
		b.Run(string(p)+"-next-cycle", func(b *testing.B) {
			e := decide.NewEngine(decide.DefaultConfig())
			if _, err := in.admitWith(ctx, e); err != nil {
				b.Fatal(err)
			}
			var res admissionResult
			for b.Loop() {
				if res, err = in.admitWith(ctx, e); err != nil {
					b.Fatal(err)
				}
			}
			if !slices.Equal(res.order, first.order) {
				b.Fatalf("the next cycle admitted %d jobs, the first %d, or in another order", len(res.order), len(first.order))
			}
			reportCycle(b, res)
		})
	}
}

func reportCycle(b *testing.B, res admissionResult) {
	b.ReportMetric(float64(res.stats.AllocatorCalls), "allocator-calls")
	b.ReportMetric(float64(res.stats.SharedFailures), "shared-failures")
	b.ReportMetric(float64(res.stats.CELEvaluations), "cel-evaluations")
	b.ReportMetric(float64(len(res.order)), "admitted")
}
