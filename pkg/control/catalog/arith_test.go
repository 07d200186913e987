package catalog

import (
	"context"
	"math"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"

	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/queue"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

func TestMulDivEdges(t *testing.T) {
	const max = math.MaxInt64
	tests := []struct{ a, b, c, want int64 }{
		{0, 0, 1, 0},
		{10, 3, 2, 15},
		{max, queue.GPU, max, queue.GPU},
		{max, max, max, max},
		{max, max, 1, max},
		{1e18, queue.GPU, 1e18, queue.GPU},
		{1e18, queue.GPU, 1, max},
		{5, 5, 0, 0},
		{5, 5, -1, 0},
		{-5, 5, 1, 0},
	}
	for _, tc := range tests {
		if got := mulDiv(tc.a, tc.b, tc.c); got != tc.want {
			t.Errorf("mulDiv(%d, %d, %d) = %d, want %d", tc.a, tc.b, tc.c, got, tc.want)
		}
	}
}

func TestRoundShareSaturates(t *testing.T) {
	d := &Device{Memory: math.MaxInt64, GPUs: queue.GPU, MinShare: 256 << 20, ShareStep: 256 << 20, Shareable: true}
	for _, mem := range []int64{math.MaxInt64, math.MaxInt64 - 1, 1e18 + 1} {
		got := d.roundShare(mem)
		if got < mem {
			t.Errorf("roundShare(%d) = %d wrapped below the request", mem, got)
		}
		ch := d.shareCharge(got)
		if ch[queue.Memory] < 0 || ch[queue.GPUs] < 0 || ch[queue.GPUs] > queue.GPU {
			t.Errorf("shareCharge(%d) = %v", got, ch)
		}
	}
}

// TestEstimateEdges: counts and capacity requests at the edges never
// yield a charge that wrapped (negative or smaller than one device's).
func TestEstimateEdges(t *testing.T) {
	slices, err := decidetest.NodeSlices("n1", decidetest.NodeOptions{Profile: "h100-80gb:2"})
	if err != nil {
		t.Fatal(err)
	}
	cat := NewCatalog(slices, decidetest.Classes(), cel.NewCache(10, cel.Features{}), nil)
	one, err := cat.EstimateClaim(context.Background(), "c", ptrSpec(decidetest.ClaimSpec(decidetest.Request{})))
	if err != nil {
		t.Fatal(err)
	}
	for _, count := range []int64{resourceapi.AllocationResultsMaxSize, math.MaxInt32, 1 << 40, math.MaxInt64} {
		spec := decidetest.ClaimSpec(decidetest.Request{})
		spec.Devices.Requests[0].Exactly.Count = count
		v, err := cat.EstimateClaim(context.Background(), "c", &spec)
		if err != nil {
			t.Fatal(err)
		}
		for r := range queue.NumResources {
			if v[r] < one[r] || v[r] != queue.SatMul(one[r], count) || (count > 1<<40 && v[r] != math.MaxInt64) {
				t.Errorf("count %d: estimate %v (one device %v)", count, v, one)
			}
		}
	}
	for _, q := range []string{"9223372036854775807", "1e18", "1e30", "-1", "-1e30", "0"} {
		spec := decidetest.ClaimSpec(decidetest.Request{Memory: "1Gi", Count: resourceapi.AllocationResultsMaxSize})
		spec.Devices.Requests[0].Exactly.Capacity.Requests[devicemodel.CapMemory] = resource.MustParse(q)
		v, err := cat.EstimateClaim(context.Background(), "c", &spec)
		if err != nil {
			t.Fatal(err)
		}
		if v[queue.Memory] < 0 || v[queue.GPUs] < 0 {
			t.Errorf("capacity %s: estimate %v wrapped", q, v)
		}
	}
}

func ptrSpec(s resourceapi.ResourceClaimSpec) *resourceapi.ResourceClaimSpec { return &s }
