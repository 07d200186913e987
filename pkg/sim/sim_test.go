package sim

import (
	"context"
	"testing"
)

func TestShowdownOnOneT4(t *testing.T) {
	ctx := context.Background()
	nodes := []NodeGroup{{Count: 1, Profile: "t4"}}
	got := map[Policy]Result{}
	for _, p := range Policies {
		r, err := Run(ctx, nodes, Showdown(), p)
		if err != nil {
			t.Fatal(err)
		}
		got[p] = r
	}
	if r := got[Shares]; r.Placed != 4 || r.GPUsUsed != 1 || r.LowerBound != 1 || r.OverCommitted != 0 {
		t.Fatalf("shares: %+v, want all 4 pods on the one T4", r)
	}
	if r := got[WholeGPU]; r.Placed != 1 || r.Pending != 3 {
		t.Fatalf("whole GPU: %+v, want 1 placed and 3 pending", r)
	}
	if ratio := got[Shares].PodsPerGPU() / got[WholeGPU].PodsPerGPU(); ratio < 4 {
		t.Fatalf("shares fit %.1fx the pods per GPU of whole-GPU allocation, want at least 4x", ratio)
	}
	if r := got[TimeSlice4]; r.Placed != 4 || r.OverCommitted != 0 {
		t.Fatalf("time slicing: %+v", r)
	}
}

func TestMixedTraceShort(t *testing.T) {
	ctx := context.Background()
	nodes, err := ParseNodes("2xdgxh100;2xdgxa100;4xt4:4")
	if err != nil {
		t.Fatal(err)
	}
	jobs := Generate(80, 1, DefaultMix)
	results := map[Policy]Result{}
	for _, p := range Policies {
		r, err := Run(ctx, nodes, jobs, p)
		if err != nil {
			t.Fatal(err)
		}
		if r.Placed+r.Pending != len(jobs) {
			t.Fatalf("%s: placed %d + pending %d != %d", p, r.Placed, r.Pending, len(jobs))
		}
		results[p] = r
	}
	sh := results[Shares]
	if sh.Pending != 0 {
		t.Fatalf("shares left %d pods pending on a cluster that holds them", sh.Pending)
	}
	if sh.GPUsUsed < sh.LowerBound {
		t.Fatalf("shares used %d GPUs, below the lower bound %d: the bound is wrong", sh.GPUsUsed, sh.LowerBound)
	}
	if sh.OverCommitted != 0 {
		t.Fatalf("memory shares over-committed %d pods", sh.OverCommitted)
	}
	if results[WholeGPU].Placed > 48 {
		t.Fatalf("whole GPU placed %d pods on 48 GPUs", results[WholeGPU].Placed)
	}
	if results[SharesMIG].OverCommitted != 0 {
		t.Fatalf("shares+MIG over-committed %d pods", results[SharesMIG].OverCommitted)
	}
	for _, p := range Policies {
		t.Logf("%+v", results[p])
	}
}

func TestParseNodesErrors(t *testing.T) {
	for _, in := range []string{"", "x", "0xt4", "3xt9", "threext4"} {
		if _, err := ParseNodes(in); err == nil {
			t.Errorf("ParseNodes(%q) accepted", in)
		}
	}
}

func TestGenerateIsReproducible(t *testing.T) {
	a, b := Generate(50, 7, DefaultMix), Generate(50, 7, DefaultMix)
	for i := range a {
		if a[i] != b[i] {
			t.Fatal("same seed, different trace")
		}
		if a[i].Usage*3 > a[i].Request || a[i].Usage*4 < a[i].Request-4 {
			t.Fatalf("job %+v: usage is not request/3..4", a[i])
		}
	}
}
