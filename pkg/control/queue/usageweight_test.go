package queue

import (
	"math"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// usageTree is the worked example of docs/controller.md, "Time-based fair
// share": parent research (usage weighting with the factor given, "" off)
// with children a and b, weight 1, no quota, each asking for 8 GPUs, on 8
// GPUs; a and b used the decayed GPU-hours given.
func usageTree(factor string, usedA, usedB string, reqA int64) *Tree {
	parent := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "research"}}
	if factor != "" {
		f := resource.MustParse(factor)
		parent.Spec.FairSharing = &v1alpha1.FairSharing{UsageWeighting: &v1alpha1.UsageWeighting{Enabled: true, Factor: &f}}
	}
	child := func(name, used string) *v1alpha1.Queue {
		q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.QueueSpec{Parent: "research",
			Resources: map[v1alpha1.ResourceName]v1alpha1.QueueResource{v1alpha1.ResourceGPUs: {}}}}
		if used != "" {
			q.Status.Usage = &v1alpha1.QueueUsage{Decayed: v1alpha1.UsageAmounts{AllocatedGPUHours: v1alpha1.Decimal(used)}}
		}
		return q
	}
	t := NewTree([]*v1alpha1.Queue{parent, child("a", usedA), child("b", usedB)})
	t.Queues["a"].Pending[GPUs] = reqA * GPU
	t.Queues["b"].Pending[GPUs] = 8 * GPU
	t.Queues["research"].Pending[GPUs] = (reqA + 8) * GPU
	t.ComputeFairShare(Vector{0, 8 * GPU})
	return t
}

func TestUsageWeightedFairShare(t *testing.T) {
	tests := []struct {
		name         string
		factor       string
		usedA, usedB string
		reqA         int64
		a, b         float64 // GPUs
	}{
		{"off: weights only", "", "30", "10", 8, 4, 4},
		{"on, no usage yet: weights only", "1", "", "", 8, 4, 4},
		{"on, equal usage: weights only", "1", "10", "10", 8, 4, 4},
		// shares 0.75 and 0.25: weights 1/1.75 and 1/1.25; a gets
		// 8 * 0.5714 / (0.5714 + 0.8) = 3.33.
		{"on, a used 3x as much as b", "1", "30", "10", 8, 8 * (1 / 1.75) / (1/1.75 + 1/1.25), 8 * (1 / 1.25) / (1/1.75 + 1/1.25)},
		// factor 3: weights 1/3.25 and 1/1.75: a gets 2.8, b 5.2.
		{"factor 3", "3", "30", "10", 8, 2.8, 5.2},
		{"only a used: a gets 1/3 (factor 1: weights 1/2 and 1)", "1", "5", "", 8, 8.0 / 3, 16.0 / 3},
		{"only a used, factor 3: a gets 1/5 (weights 1/4 and 1)", "3", "5", "", 8, 1.6, 6.4},
		{"what a does not ask for goes to b", "1", "", "40", 2, 2, 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := usageTree(tt.factor, tt.usedA, tt.usedB, tt.reqA)
			a, b := float64(tr.Queues["a"].FairShare[GPUs])/GPU, float64(tr.Queues["b"].FairShare[GPUs])/GPU
			if math.Abs(a-tt.a) > 1e-5 || math.Abs(b-tt.b) > 1e-5 {
				t.Errorf("fair share a=%.6f b=%.6f, want %.6f %.6f", a, b, tt.a, tt.b)
			}
			if got := tr.Queues["a"].FairShare[GPUs] + tr.Queues["b"].FairShare[GPUs]; got != 8*GPU {
				t.Errorf("shares add up to %d, want all 8 GPUs", got)
			}
		})
	}
}

func TestReclaimOrder(t *testing.T) {
	tests := []struct {
		name         string
		factor       string
		usedA, usedB string
		want         int // a vs b
	}{
		{"off", "", "30", "10", 0},
		{"a used more: a gives first", "1", "30", "10", -1},
		{"b used more: b gives first", "1", "10", "30", 1},
		{"equal", "1", "10", "10", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := usageTree(tt.factor, tt.usedA, tt.usedB, 8)
			if got := ReclaimOrder(tr.Queues["a"], tr.Queues["b"]); got != tt.want {
				t.Errorf("ReclaimOrder(a, b) = %d, want %d", got, tt.want)
			}
			if got := ReclaimOrder(tr.Queues["b"], tr.Queues["a"]); got != -tt.want {
				t.Errorf("ReclaimOrder(b, a) = %d, want %d", got, -tt.want)
			}
		})
	}
}
