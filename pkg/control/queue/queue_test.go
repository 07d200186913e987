package queue

import (
	"math"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// q describes a queue of a test in GPUs (the examples of KAI's and Kueue's
// documentation count GPUs or CPUs; here they are GPU equivalents).
type q struct {
	name, parent   string
	prio           int32
	quota, limit   string // GPUs; "" = unset
	weight         *int32
	alloc, pending float64 // GPUs
	wantFair       float64 // GPUs
}

func gpus(f float64) int64 { return int64(math.Round(f * GPU)) }

func buildTree(t *testing.T, qs []q) *Tree {
	t.Helper()
	var objs []*v1alpha1.Queue
	for _, x := range qs {
		res := v1alpha1.QueueResource{OverQuotaWeight: x.weight}
		if x.quota != "" {
			res.Quota = ptr.To(resource.MustParse(x.quota))
		}
		if x.limit != "" {
			res.Limit = ptr.To(resource.MustParse(x.limit))
		}
		objs = append(objs, &v1alpha1.Queue{
			ObjectMeta: metav1.ObjectMeta{Name: x.name},
			Spec: v1alpha1.QueueSpec{
				Parent: x.parent, Priority: x.prio,
				Resources: map[v1alpha1.ResourceName]v1alpha1.QueueResource{v1alpha1.ResourceGPUs: res},
			},
		})
	}
	tree := NewTree(objs)
	for _, x := range qs {
		if x.alloc > 0 {
			Charge(tree.Queues[x.name], Vector{GPUs: gpus(x.alloc)})
		}
		if x.pending > 0 {
			AddPending(tree.Queues[x.name], Vector{GPUs: gpus(x.pending)})
		}
	}
	return tree
}

// TestFairShare reproduces the worked examples of KAI's and Kueue's
// documentation (cited per case) with our fair-share computation.
func TestFairShare(t *testing.T) {
	w := func(n int32) *int32 { return &n }
	tests := []struct {
		name     string
		capacity float64
		queues   []q
	}{
		{
			// KAI docs/scheduling-deep-dive "Queue Priority": a 10-GPU
			// cluster, three queues; each first gets its quota regardless of
			// priority, then the 3 surplus GPUs go to the highest priority
			// bucket, split 2:1 by weight between Vision and LLM. (The
			// quotas are in a diagram; 3/2/2 reproduces the text.)
			name:     "KAI deep dive: quota first, surplus by priority then weight",
			capacity: 10,
			queues: []q{
				{name: "vision", prio: 2, quota: "3", weight: w(2), pending: 10, wantFair: 5},
				{name: "llm", prio: 2, quota: "2", weight: w(1), pending: 10, wantFair: 3},
				{name: "research", prio: 1, quota: "2", weight: w(1), pending: 10, wantFair: 2},
			},
		},
		{
			// KAI deep dive "Key Points": priority=2, weight=1 gets surplus
			// before priority=1, weight=100.
			name:     "KAI: priority overrides weight",
			capacity: 10,
			queues: []q{
				{name: "high", prio: 2, weight: w(1), pending: 10, wantFair: 10},
				{name: "low", prio: 1, weight: w(100), pending: 10, wantFair: 0},
			},
		},
		{
			// KAI docs/fairness: deserved = min(quota, requested); queues
			// that got all they requested get nothing more, the rest is
			// split by weight among the others (the water-filling loop).
			name:     "KAI: min(quota, requested), then water-filling",
			capacity: 12,
			queues: []q{
				{name: "a", quota: "4", pending: 1, wantFair: 1},
				{name: "b", quota: "2", pending: 3, wantFair: 3},
				{name: "c", quota: "2", pending: 20, wantFair: 8},
			},
		},
		{
			// The water-filling loop hands leftovers of a capped queue to
			// the others in the same bucket, by weight.
			name:     "KAI: leftovers of a capped queue are split again",
			capacity: 12,
			queues: []q{
				{name: "a", weight: w(1), pending: 2, wantFair: 2},
				// 12 split 1:1:2 is 3/3/6; a needs only 2, its 1 left
				// over is split 1:2 again.
				{name: "b", weight: w(1), pending: 20, wantFair: 3 + 1.0/3},
				{name: "c", weight: w(2), pending: 20, wantFair: 6 + 2.0/3},
			},
		},
		{
			// Kueue KEP-1714 "Fair Sharing", story 3: CS lends 300 GPUs;
			// C1 and C2 get 150 each; inside C1, 1C weighs 3x 1A and 1B:
			// 30/30/90; C2's only queue 2A gets 150.
			name:     "Kueue KEP-1714 story 3: hierarchical weights",
			capacity: 300,
			queues: []q{
				{name: "cs", quota: "300", wantFair: 0},
				{name: "c1", wantFair: 150},
				{name: "1a", parent: "c1", pending: 1000, wantFair: 30},
				{name: "1b", parent: "c1", pending: 1000, wantFair: 30},
				{name: "1c", parent: "c1", weight: w(3), pending: 1000, wantFair: 90},
				{name: "c2", wantFair: 150},
				{name: "2a", parent: "c2", pending: 1000, wantFair: 150},
			},
		},
		{
			// Kueue docs "ClusterQueue" borrowingLimit: team-a-cq nominal 9,
			// borrowingLimit 1 (our limit 10); team-b-cq nominal 12 is idle:
			// team-a can use 9+1=10 of the cohort's 21.
			name:     "Kueue cluster_queue: borrowing limit caps team-a at 10",
			capacity: 21,
			queues: []q{
				{name: "team-a", quota: "9", limit: "10", pending: 21, wantFair: 10},
				{name: "team-b", quota: "12", wantFair: 0},
			},
		},
		{
			// Same docs: without a borrowing limit team-b-cq can borrow
			// team-a-cq's 9 when team-a is idle: 12+9.
			name:     "Kueue cluster_queue: no borrowing limit, team-b takes 12+9",
			capacity: 21,
			queues: []q{
				{name: "team-a", quota: "9", limit: "10", wantFair: 0},
				{name: "team-b", quota: "12", pending: 30, wantFair: 21},
			},
		},
		{
			name:     "allocated counts as request; weight 0 gets no surplus",
			capacity: 8,
			queues: []q{
				{name: "a", quota: "2", weight: w(0), alloc: 4, wantFair: 2},
				{name: "b", quota: "2", alloc: 1, pending: 10, wantFair: 6},
			},
		},
		{
			name:     "limit on a parent caps the subtree",
			capacity: 16,
			queues: []q{
				{name: "org", limit: "6", wantFair: 6},
				{name: "x", parent: "org", pending: 10, wantFair: 3},
				{name: "y", parent: "org", pending: 10, wantFair: 3},
				{name: "other", pending: 4, wantFair: 4},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tree := buildTree(t, tc.queues)
			tree.ComputeFairShare(Vector{GPUs: gpus(tc.capacity)})
			for _, x := range tc.queues {
				got := float64(tree.Queues[x.name].FairShare[GPUs]) / GPU
				if math.Abs(got-x.wantFair) > 1e-5 {
					t.Errorf("queue %s: fair share %g GPUs, want %g", x.name, got, x.wantFair)
				}
			}
		})
	}
}

func TestFairShareSplitsTheRemainderExactly(t *testing.T) {
	tree := buildTree(t, []q{{name: "a", pending: 10}, {name: "b", pending: 10}, {name: "c", pending: 10}})
	tree.ComputeFairShare(Vector{GPUs: 1_000_001, Memory: 10})
	var sum Vector
	for _, x := range tree.Queues {
		sum = sum.Add(x.FairShare)
	}
	if sum[GPUs] != 1_000_001 {
		t.Errorf("fair shares add up to %d micro-GPUs, want all 1000001", sum[GPUs])
	}
}

func TestDominantShareOrder(t *testing.T) {
	mk := func(name string, prio int32, alloc, fair Vector) *Queue {
		return &Queue{Name: name, Priority: prio, Allocated: alloc, FairShare: fair}
	}
	gi := int64(1 << 30)
	tests := []struct {
		name string
		a, b *Queue
		want bool // a before b
	}{
		{"lower dominant share first", mk("a", 0, Vector{4 * gi, GPU}, Vector{16 * gi, 4 * GPU}), mk("b", 0, Vector{8 * gi, GPU}, Vector{16 * gi, 4 * GPU}), true},
		{"dominant is the larger ratio (memory)", mk("a", 0, Vector{12 * gi, GPU}, Vector{16 * gi, 4 * GPU}), mk("b", 0, Vector{4 * gi, 2 * GPU}, Vector{16 * gi, 4 * GPU}), false},
		{"priority first", mk("a", 0, Vector{}, Vector{16 * gi, 4 * GPU}), mk("b", 1, Vector{16 * gi, 4 * GPU}, Vector{16 * gi, 4 * GPU}), false},
		{"holding without fair share is last", mk("a", 0, Vector{gi, 0}, Vector{}), mk("b", 0, Vector{16 * gi, 0}, Vector{gi, 0}), false},
		{"ties by name", mk("a", 0, Vector{}, Vector{}), mk("b", 0, Vector{}, Vector{}), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Before(tc.a, tc.b); got != tc.want {
				t.Errorf("Before(a, b) = %v, want %v (shares %g, %g)", got, tc.want, tc.a.DominantShare(), tc.b.DominantShare())
			}
		})
	}
}

func TestLimitsAndQuota(t *testing.T) {
	gi := int64(1 << 30)
	mem := func(quota, limit string) v1alpha1.QueueResource {
		r := v1alpha1.QueueResource{}
		if quota != "" {
			r.Quota = ptr.To(resource.MustParse(quota))
		}
		if limit != "" {
			r.Limit = ptr.To(resource.MustParse(limit))
		}
		return r
	}
	mkTree := func() *Tree {
		return NewTree([]*v1alpha1.Queue{
			{ObjectMeta: metav1.ObjectMeta{Name: "org"}, Spec: v1alpha1.QueueSpec{Resources: map[v1alpha1.ResourceName]v1alpha1.QueueResource{v1alpha1.ResourceGPUMemory: mem("32Gi", "40Gi")}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}, Spec: v1alpha1.QueueSpec{Parent: "org", Resources: map[v1alpha1.ResourceName]v1alpha1.QueueResource{v1alpha1.ResourceGPUMemory: mem("16Gi", "16Gi")}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "team-b"}, Spec: v1alpha1.QueueSpec{Parent: "org", Resources: map[v1alpha1.ResourceName]v1alpha1.QueueResource{v1alpha1.ResourceGPUMemory: mem("16Gi", "")}}},
		})
	}
	tests := []struct {
		name               string
		allocA, allocB     int64
		queue              string
		need               int64
		wantLimit, wantQuo string // "" = no violation
	}{
		{"the issue's example", 12 * gi, 0, "team-a", 8 * gi, "queue team-a: needs 8Gi gpu memory; quota 16Gi, in use 12Gi, limit 16Gi", "queue team-a: needs 8Gi gpu memory; quota 16Gi, in use 12Gi, limit 16Gi"},
		{"fits quota exactly", 12 * gi, 0, "team-a", 4 * gi, "", ""},
		{"over quota, no limit on leaf, under org limit", 0, 16 * gi, "team-b", 8 * gi, "", "queue team-b: needs 8Gi gpu memory; quota 16Gi, in use 16Gi, no limit"},
		{"ancestor limit", 16 * gi, 20 * gi, "team-b", 8 * gi, "queue org (ancestor of team-b): needs 8Gi gpu memory; quota 32Gi, in use 36Gi, limit 40Gi", "queue team-b: needs 8Gi gpu memory; quota 16Gi, in use 20Gi, no limit"},
		{"ancestor over quota though leaf is not", 4 * gi, 30 * gi, "team-a", 2 * gi, "", "queue org (ancestor of team-a): needs 2Gi gpu memory; quota 32Gi, in use 34Gi, limit 40Gi"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tree := mkTree()
			Charge(tree.Queues["team-a"], Vector{Memory: tc.allocA})
			Charge(tree.Queues["team-b"], Vector{Memory: tc.allocB})
			leaf := tree.Queues[tc.queue]
			got := ""
			if v := CheckLimits(leaf, Vector{Memory: tc.need}); v != nil {
				got = v.Message(leaf)
			}
			if got != tc.wantLimit {
				t.Errorf("limit: got %q, want %q", got, tc.wantLimit)
			}
			got = ""
			if v := CheckQuota(leaf, Vector{Memory: tc.need}); v != nil {
				got = v.Message(leaf)
			}
			if got != tc.wantQuo {
				t.Errorf("quota: got %q, want %q", got, tc.wantQuo)
			}
		})
	}
}

func TestCanGive(t *testing.T) {
	tree := buildTree(t, []q{
		{name: "org", quota: "4"},
		{name: "a", parent: "org", quota: "2", alloc: 3},
		{name: "b", parent: "org", quota: "2", alloc: 1},
		{name: "c", quota: "1", alloc: 4},
	})
	a, c := tree.Queues["a"], tree.Queues["c"]
	if !CanGive(a, tree.Queues["org"], Vector{GPUs: GPU}) {
		t.Error("a holds 3 of quota 2: giving 1 keeps it at quota")
	}
	if CanGive(a, tree.Queues["org"], Vector{GPUs: 2 * GPU}) {
		t.Error("a giving 2 would fall below its quota")
	}
	if CanGive(a, nil, Vector{GPUs: GPU}) {
		t.Error("org holds exactly its quota 4: giving 1 to another top-level queue takes it below")
	}
	if !CanGive(c, nil, Vector{GPUs: 3 * GPU}) {
		t.Error("c holds 4 of quota 1: giving 3 is fine")
	}
}

func TestTreeProblems(t *testing.T) {
	mk := func(name, parent string) *v1alpha1.Queue {
		return &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.QueueSpec{Parent: parent}}
	}
	tree := NewTree([]*v1alpha1.Queue{mk("a", "b"), mk("b", "a"), mk("c", "ghost"), mk("d", "c"), mk("root", ""), mk("leaf", "root")})
	for name, want := range map[string]string{
		"a":    "parent cycle",
		"b":    "parent cycle",
		"c":    `parent "ghost", which does not exist`,
		"d":    `parent "ghost", which does not exist`,
		"root": "",
		"leaf": "",
	} {
		got := tree.Queues[name].Invalid
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("queue %s: Invalid = %q, want it to contain %q", name, got, want)
		}
	}
	if tree.Queues["root"].IsLeaf() || !tree.Queues["leaf"].IsLeaf() {
		t.Error("leaf detection is wrong")
	}
}

func TestValidate(t *testing.T) {
	mk := func(name, parent string, quota, limit string) *v1alpha1.Queue {
		r := v1alpha1.QueueResource{}
		if quota != "" {
			r.Quota = ptr.To(resource.MustParse(quota))
		}
		if limit != "" {
			r.Limit = ptr.To(resource.MustParse(limit))
		}
		return &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.QueueSpec{Parent: parent,
			Resources: map[v1alpha1.ResourceName]v1alpha1.QueueResource{v1alpha1.ResourceGPUMemory: r}}}
	}
	existing := []*v1alpha1.Queue{mk("org", "", "", ""), mk("team-a", "org", "", ""), mk("sub", "team-a", "", "")}
	tests := []struct {
		name string
		q    *v1alpha1.Queue
		want string
	}{
		{"valid", mk("team-b", "org", "16Gi", "32Gi"), ""},
		{"quota above limit", mk("team-b", "org", "32Gi", "16Gi"), "quota 32Gi is above limit 16Gi"},
		{"unknown parent", mk("team-b", "nope", "", ""), `queue "nope" does not exist`},
		{"own parent", mk("team-b", "team-b", "", ""), "cannot be its own parent"},
		{"cycle through an update", mk("org", "sub", "", ""), "would make a cycle (org -> sub -> team-a -> org)"},
		{"negative", mk("team-b", "", "-1Gi", ""), "must not be negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			errs := Validate(tc.q, existing)
			got := strings.Join(errs, "; ")
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("Validate = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		r    Resource
		v    int64
		want string
	}{
		{Memory, 8 << 30, "8Gi"}, {Memory, 3 << 29, "1.5Gi"}, {Memory, 300 << 20, "300Mi"}, {Memory, 0, "0"},
		{GPUs, GPU, "1"}, {GPUs, GPU / 2, "0.5"}, {GPUs, GPU / 3, "0.333"}, {GPUs, 0, "0"},
	} {
		if got := FormatAmount(tc.r, tc.v); got != tc.want {
			t.Errorf("FormatAmount(%d, %d) = %q, want %q", tc.r, tc.v, got, tc.want)
		}
	}
	if q := Quantity(GPUs, GPU/2); q.String() != "500m" {
		t.Errorf("Quantity(0.5 GPU) = %s", q.String())
	}
	if v := FromQuantity(GPUs, resource.MustParse("0.25")); v != GPU/4 {
		t.Errorf("FromQuantity(0.25) = %d", v)
	}
}

func TestParentWithoutResourcesOnlyGroups(t *testing.T) {
	mem := func(quota string) map[v1alpha1.ResourceName]v1alpha1.QueueResource {
		return map[v1alpha1.ResourceName]v1alpha1.QueueResource{v1alpha1.ResourceGPUMemory: {Quota: ptr.To(resource.MustParse(quota))}}
	}
	tree := NewTree([]*v1alpha1.Queue{
		{ObjectMeta: metav1.ObjectMeta{Name: "lab"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: v1alpha1.QueueSpec{Parent: "lab", Resources: mem("10Gi")}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: v1alpha1.QueueSpec{Parent: "lab", Resources: mem("6Gi")}},
		{ObjectMeta: metav1.ObjectMeta{Name: "idle"}},
	})
	gi := int64(1 << 30)
	if v := CheckQuota(tree.Queues["a"], Vector{Memory: 8 * gi}); v != nil {
		t.Errorf("a parent listing no resources bounds its children: %s", v.Message(tree.Queues["a"]))
	}
	if got := tree.Queues["lab"].Quota[Memory]; got != 16*gi {
		t.Errorf("lab's quota for fair share is %d, want the children's 16Gi", got)
	}
	if v := CheckQuota(tree.Queues["idle"], Vector{Memory: gi}); v == nil {
		t.Error("a leaf listing no resources has quota 0")
	}
}

// Amounts too large for 64 bits saturate instead of wrapping to 0 or a
// negative number, and sums saturate instead of overflowing.
func TestQuantitiesSaturate(t *testing.T) {
	for _, tc := range []struct {
		r    Resource
		q    string
		want int64
	}{
		{Memory, "1e30", math.MaxInt64},
		{GPUs, "1e30", math.MaxInt64},
		{GPUs, "1e13", math.MaxInt64}, // 1e19 micro-GPUs
		{GPUs, "9e12", 9e18},
		{Memory, "1e18", 1e18},
		{Memory, "-1e30", math.MinInt64},
		{Memory, "16Gi", 16 << 30},
		{GPUs, "1m", 1000},
		{GPUs, "0", 0},
	} {
		if got := FromQuantity(tc.r, resource.MustParse(tc.q)); got != tc.want {
			t.Errorf("FromQuantity(%s, %s) = %d, want %d", HumanName(tc.r), tc.q, got, tc.want)
		}
	}
	for _, tc := range []struct {
		a, b, sum, diff int64
	}{
		{math.MaxInt64, 1, math.MaxInt64, math.MaxInt64 - 1},
		{math.MaxInt64, math.MaxInt64, math.MaxInt64, 0},
		{math.MinInt64, 1, math.MinInt64 + 1, math.MinInt64},
		{1, math.MinInt64, math.MinInt64 + 1, math.MaxInt64},
		{5, 3, 8, 2},
	} {
		if got := (Vector{Memory: tc.a}).Add(Vector{Memory: tc.b})[Memory]; got != tc.sum {
			t.Errorf("%d + %d = %d, want %d", tc.a, tc.b, got, tc.sum)
		}
		if got := (Vector{Memory: tc.a}).Sub(Vector{Memory: tc.b})[Memory]; got != tc.diff {
			t.Errorf("%d - %d = %d, want %d", tc.a, tc.b, got, tc.diff)
		}
	}
}
