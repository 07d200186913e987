package catalog_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/cel"

	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/catalog"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/queue"
)

const mib = int64(1) << 20

// H100 figures of the mock: 81559 MiB, 256 MiB reserved.
const h100Usable = (81559 - 256) * mib

func node(t *testing.T, name string, o decidetest.NodeOptions) []*resourceapi.ResourceSlice {
	t.Helper()
	s, err := decidetest.NodeSlices(name, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestCapacity(t *testing.T) {
	slices := append(node(t, "n1", decidetest.NodeOptions{Profile: "dgxh100"}), node(t, "n2", decidetest.NodeOptions{Profile: "h100-80gb:2", TimeSlices: 4})...)
	slices = append(slices, node(t, "n3", decidetest.NodeOptions{Profile: "h100-80gb:1", MIG: true})...)
	c := catalog.NewCatalog(slices, decidetest.Classes(), cel.NewCache(10, cel.Features{}), nil)
	got := c.Capacity()
	// A MIG GPU counts its largest profile (7g.80gb: 80896 MiB).
	want := queue.Vector{queue.Memory: 10*h100Usable + 80896*mib, queue.GPUs: 11 * queue.GPU}
	if got != want {
		t.Errorf("capacity %v, want %v", got, want)
	}
}

// TestEstimateMatchesAllocation estimates claims, allocates them with the
// scheduler's allocator and checks that the real charge of the allocation
// is the estimate, for every kind of device.
func TestEstimateMatchesAllocation(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name     string
		node     decidetest.NodeOptions
		reqs     []decidetest.Request
		want     queue.Vector
		wantDevs int
	}{
		{"whole GPU", decidetest.NodeOptions{Profile: "dgxh100"}, []decidetest.Request{{}},
			queue.Vector{queue.Memory: h100Usable, queue.GPUs: queue.GPU}, 1},
		{"two whole GPUs", decidetest.NodeOptions{Profile: "dgxh100"}, []decidetest.Request{{Count: 2}},
			queue.Vector{queue.Memory: 2 * h100Usable, queue.GPUs: 2 * queue.GPU}, 2},
		{"8Gi share", decidetest.NodeOptions{Profile: "dgxh100"}, []decidetest.Request{{Memory: "8Gi"}},
			queue.Vector{queue.Memory: 8192 * mib, queue.GPUs: 8192 * mib * queue.GPU / h100Usable}, 1},
		{"share rounded up to 256Mi", decidetest.NodeOptions{Profile: "dgxh100"}, []decidetest.Request{{Memory: "100Mi"}},
			queue.Vector{queue.Memory: 256 * mib, queue.GPUs: 256 * mib * queue.GPU / h100Usable}, 1},
		{"time slice of 4", decidetest.NodeOptions{Profile: "h100-80gb:2", TimeSlices: 4}, []decidetest.Request{{Class: "timeslice.tessera.dev"}},
			queue.Vector{queue.Memory: (h100Usable / 4) &^ (mib - 1), queue.GPUs: queue.GPU / 4}, 1},
		{"MIG 3g.40gb", decidetest.NodeOptions{Profile: "h100-80gb:1", MIG: true},
			[]decidetest.Request{{Class: "mig.tessera.dev", Selector: `device.attributes["gpu.tessera.dev"].migProfile == "3g.40gb"`}},
			queue.Vector{queue.Memory: 40192 * mib, queue.GPUs: 3 * queue.GPU / 7}, 1},
		{"share and MIG-free GPU in one claim", decidetest.NodeOptions{Profile: "dgxh100"}, []decidetest.Request{{Memory: "10Gi"}, {}},
			queue.Vector{queue.Memory: 10240*mib + h100Usable, queue.GPUs: 10240*mib*queue.GPU/h100Usable + queue.GPU}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			slices := node(t, "n1", tc.node)
			classes := decidetest.Classes()
			cat := catalog.NewCatalog(slices, classes, cel.NewCache(10, cel.Features{}), nil)
			claim := decidetest.Claim("ns", "c", tc.reqs...)
			est, err := cat.EstimateClaim(ctx, "c", &claim.Spec)
			if err != nil {
				t.Fatal(err)
			}
			if est != tc.want {
				t.Errorf("estimate %v (%v), want %v (%v)", est, est[:], tc.want, tc.want[:])
			}
			alloc := allocation.NewAllocator(slices, classes)
			res, err := alloc.Allocate(ctx, decidetest.Node("n1"), allocation.NewState(), claim)
			if err != nil || res == nil {
				t.Fatalf("allocate: %v %v", res, err)
			}
			if n := len(res[0].Devices.Results); n != tc.wantDevs {
				t.Errorf("allocated %d devices, want %d", n, tc.wantDevs)
			}
			if real := cat.ChargeAllocation(&res[0]); real != tc.want {
				t.Errorf("charge of the allocation %v, want %v", real, tc.want)
			}
		})
	}
}

func TestEstimateErrors(t *testing.T) {
	ctx := context.Background()
	other := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "nic.example.com"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "nic.example.com"`}}}}}
	cat := catalog.NewCatalog(node(t, "n1", decidetest.NodeOptions{Profile: "dgxh100"}), append(decidetest.Classes(), other), cel.NewCache(10, cel.Features{}), nil)
	tests := []struct {
		name    string
		req     decidetest.Request
		bad     bool
		message string
	}{
		{"unknown class", decidetest.Request{Class: "nope"}, true, `device class "nope" does not exist`},
		{"nothing matches yet", decidetest.Request{Class: "mig.tessera.dev"}, false, "no published gpu.tessera.dev device matches class mig.tessera.dev"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			claim := decidetest.Claim("ns", "c", tc.req)
			_, err := cat.EstimateClaim(ctx, "c", &claim.Spec)
			var bad *catalog.BadInputError
			if err == nil || errors.As(err, &bad) != tc.bad || !strings.Contains(err.Error(), tc.message) {
				t.Errorf("err = %v (bad input %v), want %q (bad input %v)", err, errors.As(err, &bad), tc.message, tc.bad)
			}
		})
	}
}

func TestChargeOfSharesIsConsumedCapacity(t *testing.T) {
	ctx := context.Background()
	slices := node(t, "n1", decidetest.NodeOptions{Profile: "h100-80gb:1"})
	classes := decidetest.Classes()
	cat := catalog.NewCatalog(slices, classes, cel.NewCache(10, cel.Features{}), nil)
	alloc := allocation.NewAllocator(slices, classes)
	state := allocation.NewState()
	var total queue.Vector
	for i, size := range []string{"20Gi", "20Gi", "30Gi"} {
		claim := decidetest.Claim("ns", "c"+string(rune('a'+i)), decidetest.Request{Memory: size})
		res, err := alloc.Allocate(ctx, decidetest.Node("n1"), state, claim)
		if err != nil || res == nil {
			t.Fatalf("share %d: %v %v", i, res, err)
		}
		state.Add(&res[0])
		total = total.Add(cat.ChargeAllocation(&res[0]))
	}
	if total[queue.Memory] != 70*1024*mib {
		t.Errorf("three shares on one GPU charge %s, want 70Gi", queue.FormatAmount(queue.Memory, total[queue.Memory]))
	}
	// A fourth 20Gi share does not fit on the 79.4Gi GPU.
	res, _ := alloc.Allocate(ctx, decidetest.Node("n1"), state, decidetest.Claim("ns", "cd", decidetest.Request{Memory: "20Gi"}))
	if res != nil {
		t.Error("a fourth 20Gi share fit")
	}
}

// TestIsOurClass decides by evaluating the class's selectors against the
// driver's devices, not by looking for the driver's name in their text.
func TestIsOurClass(t *testing.T) {
	ctx := context.Background()
	class := func(expr string) *resourceapi.DeviceClass {
		return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "c"},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}}}
	}
	published := catalog.NewCatalog(node(t, "n1", decidetest.NodeOptions{Profile: "h100-80gb:1"}), nil, cel.NewCache(10, cel.Features{}), nil)
	empty := catalog.NewCatalog(nil, nil, cel.NewCache(10, cel.Features{}), nil)
	for _, tt := range []struct {
		expr      string
		published bool
		empty     bool
	}{
		{`device.driver == "gpu.tessera.dev"`, true, true},
		{`device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == "gpu"`, true, true},
		{`device.attributes["gpu.tessera.dev"].type == "mig"`, false, false},
		{`device.driver != "gpu.tessera.dev"`, false, false},
		{`device.driver == "nic.example.com"`, false, false},
		{`device.attributes["nic.example.com"].speed > 10`, false, false},
		{`not valid CEL (`, false, false},
	} {
		if got := published.IsOurClass(ctx, class(tt.expr)); got != tt.published {
			t.Errorf("%s with devices published: %v, want %v", tt.expr, got, tt.published)
		}
		if got := empty.IsOurClass(ctx, class(tt.expr)); got != tt.empty {
			t.Errorf("%s before any device is published: %v, want %v", tt.expr, got, tt.empty)
		}
	}
	for _, dc := range decidetest.Classes() {
		if !published.IsOurClass(ctx, dc) {
			t.Errorf("the chart's class %s is not ours", dc.Name)
		}
	}
}
