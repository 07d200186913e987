package queue

import (
	"math"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

func TestSaturatingArithmetic(t *testing.T) {
	const max, min = math.MaxInt64, math.MinInt64
	tests := []struct {
		name          string
		a, b          int64
		add, sub, mul int64
	}{
		{"zero", 0, 0, 0, 0, 0},
		{"small", 3, 4, 7, -1, 12},
		{"max+1", max, 1, max, max - 1, max},
		{"max+max", max, max, max, 0, max},
		{"min-1", min, 1, min + 1, min, min},
		{"min+min", min, min, min, 0, max},
		{"max-min", max, min, -1, max, min},
		{"0-min", 0, min, min, max, 0},
		{"1e18*10", 1e18, 10, 1e18 + 10, 1e18 - 10, max},
		{"-1e18*10", -1e18, 10, -1e18 + 10, -1e18 - 10, min},
		{"count 32 of 80Gi", 80 << 30, 32, 80<<30 + 32, 80<<30 - 32, 80 << 35},
		{"huge count", 1 << 30, max, max, 1<<30 - max, max},
		{"-1*min", -1, min, min, max, max},
		{"min*1", min, 1, min + 1, min, min},
		{"min*-1", min, -1, min, min + 1, max},
	}
	for _, tc := range tests {
		if got := satAdd(tc.a, tc.b); got != tc.add {
			t.Errorf("%s: satAdd(%d, %d) = %d, want %d", tc.name, tc.a, tc.b, got, tc.add)
		}
		if got := satSub(tc.a, tc.b); got != tc.sub {
			t.Errorf("%s: satSub(%d, %d) = %d, want %d", tc.name, tc.a, tc.b, got, tc.sub)
		}
		if got := SatMul(tc.a, tc.b); got != tc.mul {
			t.Errorf("%s: SatMul(%d, %d) = %d, want %d", tc.name, tc.a, tc.b, got, tc.mul)
		}
		v := Vector{tc.a, tc.b}
		if got := v.Add(Vector{tc.b, tc.a}); got[0] != tc.add {
			t.Errorf("%s: Vector.Add = %v, want %d", tc.name, got, tc.add)
		}
		if got := v.Sub(Vector{tc.b, tc.a}); got[0] != tc.sub {
			t.Errorf("%s: Vector.Sub = %v, want %d", tc.name, got, tc.sub)
		}
	}
}

func TestFromQuantityEdges(t *testing.T) {
	tests := []struct {
		q    string
		r    Resource
		want int64
	}{
		{"9223372036854775807", Memory, math.MaxInt64},
		{"9223372036854775808", Memory, math.MaxInt64},
		{"1e18", Memory, 1e18},
		{"1e30", Memory, math.MaxInt64},
		{"-1e30", Memory, math.MinInt64},
		{"-1", Memory, -1},
		{"1e18", GPUs, math.MaxInt64},
		{"9223372036854", GPUs, 9223372036854000000},
		{"9223372036855", GPUs, math.MaxInt64},
		{"0.5", GPUs, GPU / 2},
	}
	for _, tc := range tests {
		if got := FromQuantity(tc.r, resource.MustParse(tc.q)); got != tc.want {
			t.Errorf("FromQuantity(%s, %s) = %d, want %d", HumanName(tc.r), tc.q, got, tc.want)
		}
	}
}

// TestLimitsDoNotWrap: a charge that would wrap past MaxInt64 is over any
// limit, never under it.
func TestLimitsDoNotWrap(t *testing.T) {
	tree := NewTree(nil)
	q := &Queue{Name: "q", Limit: Vector{1 << 40, NoLimit}, Quota: Vector{1 << 30, 0}, Bounded: [NumResources]bool{true, false}}
	tree.Queues["q"] = q
	Charge(q, Vector{1e18, 0})
	for _, charge := range []int64{math.MaxInt64, math.MaxInt64 - 1e18 + 1, 1e18} {
		if v := CheckLimits(q, Vector{charge, 0}); v == nil {
			t.Errorf("charge %d on top of 1e18 passes a limit of 1Ti", charge)
		}
		if v := CheckQuota(q, Vector{charge, 0}); v == nil {
			t.Errorf("charge %d on top of 1e18 passes a quota of 1Gi", charge)
		}
	}
	Charge(q, Vector{math.MaxInt64, 0})
	if q.Allocated[Memory] != math.MaxInt64 {
		t.Errorf("allocated wrapped to %d", q.Allocated[Memory])
	}
}
