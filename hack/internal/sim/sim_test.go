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
		r := mustRun(t, ctx, Cluster{Nodes: nodes}, Showdown(), p)
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
	nodes := mustParseNodes(t, "2xdgxh100;2xdgxa100;4xt4:4")
	jobs := Generate(80, 1, DefaultMix)
	results := map[Policy]Result{}
	for _, p := range Policies {
		r := mustRun(t, ctx, Cluster{Nodes: nodes}, jobs, p)
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

func TestQueuesHoldWhatTheirLimitDoesNot(t *testing.T) {
	ctx := context.Background()
	nodes := mustParseNodes(t, "2xdgxh100;4xt4:4")
	queues, err := ParseQueues("training=64Gi:128Gi")
	if err != nil {
		t.Fatal(err)
	}
	jobs := Generate(60, 1, DefaultMix)
	var training, trainingDemand int
	for _, j := range jobs {
		if j.Kind == "training" {
			training++
			trainingDemand += int(j.Request >> 30)
		}
	}
	if trainingDemand <= 128 {
		t.Fatalf("the trace's training jobs ask for %d GiB: the test needs more than the limit, 128Gi", trainingDemand)
	}
	free := mustRun(t, ctx, Cluster{Nodes: nodes}, jobs, Shares)
	queued := mustRun(t, ctx, Cluster{Nodes: nodes, Queues: queues}, jobs, Shares)
	if free.Pending != 0 || free.HeldByQueue != 0 {
		t.Fatalf("without queues: %+v, want every job placed", free)
	}
	if queued.HeldByQueue == 0 || queued.HeldByQueue >= training {
		t.Fatalf("with training limited to 128Gi: %d of %d training jobs held, want some but not all", queued.HeldByQueue, training)
	}
	if queued.Placed+queued.Pending != len(jobs) || queued.Pending != queued.HeldByQueue {
		t.Fatalf("with queues: %+v, want only the held jobs pending (the cluster has room)", queued)
	}
	if queued.Demand > free.Demand-uint64(trainingDemand-128)<<30 {
		t.Fatalf("with queues the placed jobs ask for %d GiB, more than the training limit allows", queued.Demand>>30)
	}
	if queued.AdmissionTime <= 0 {
		t.Fatal("admission time not reported")
	}
}

func TestParseQueues(t *testing.T) {
	got, err := ParseQueues("training=1Ti:2Ti; inference=:")
	if err != nil {
		t.Fatal(err)
	}
	want := []QueueSpec{{Name: "training", Quota: "1Ti", Limit: "2Ti"}, {Name: "inference"}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for _, in := range []string{"", "training", "training=1Ti", "=1Ti:2Ti", "training=lots:"} {
		if _, err := ParseQueues(in); err == nil {
			t.Errorf("ParseQueues(%q) accepted", in)
		}
	}
}

// TestPruningChangesNoPlacement replays a trace with the pruning of nodes
// that cannot fit a job and without it: the results must be the same.
func TestPruningChangesNoPlacement(t *testing.T) {
	ctx := context.Background()
	nodes := mustParseNodes(t, "1xdgxh100;1xdgxa100;2xt4:4")
	jobs := Generate(150, 3, DefaultMix)
	for _, p := range Policies {
		pruned := mustRun(t, ctx, Cluster{Nodes: nodes}, jobs, p)
		full := mustRun(t, ctx, Cluster{Nodes: nodes, exhaustive: true}, jobs, p)
		if pruned != full {
			t.Errorf("%s: pruned %+v, exhaustive %+v", p, pruned, full)
		}
		if p == Shares && full.Pending == 0 {
			t.Errorf("shares placed every job: the trace does not fill the cluster, so pruning is not exercised")
		}
	}
}

func mustParseNodes(t *testing.T, s string) []NodeGroup {
	t.Helper()
	nodes, err := ParseNodes(s)
	if err != nil {
		t.Fatal(err)
	}
	return nodes
}

func mustRun(t *testing.T, ctx context.Context, cl Cluster, jobs []Job, p Policy) Result {
	t.Helper()
	r, err := Run(ctx, cl, jobs, p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
