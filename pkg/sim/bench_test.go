package sim

import (
	"context"
	"testing"
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
