package decide

import (
	"context"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
)

// The placement shortcuts (shortcuts.go) rely on two behaviours of the
// upstream allocator that its API does not promise. These tests pin them
// for every feature set the controller can run the allocator with, so
// that a change upstream fails here, naming the assumption, before it can
// make the shortcuts place differently from the scheduler:
//
//   - first fit in list order: of the devices a request can take, the
//     allocator takes the first in slice order (dropping devices no
//     request can select therefore changes nothing);
//   - counters from allocated devices: what a device's counter set has
//     left is derived from the devices in the allocated state alone (so
//     keeping every allocated device keeps every counter check the same).

func oneRequestClaim(name string, req resourceapi.ExactDeviceRequest) *resourceapi.ResourceClaim {
	req.AllocationMode, req.Count = resourceapi.DeviceAllocationModeExactCount, 1
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			{Name: "r", Exactly: &req},
		}}},
	}
}

// allocatedDevice allocates cl alone on the node and returns the device.
func allocatedDevice(t *testing.T, f structured.Features, state *allocation.State, slices []*resourceapi.ResourceSlice, cl *resourceapi.ResourceClaim) (string, *resourceapi.AllocationResult) {
	t.Helper()
	res, err := allocation.Allocate(context.Background(), f, state, decidetest.Classes(), slices, cel.NewCache(10, cel.Features{}), decidetest.Node("n"), []*resourceapi.ResourceClaim{cl})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || len(res[0].Devices.Results) != 1 {
		t.Fatalf("claim %s: allocation %+v, want one device", cl.Name, res)
	}
	return res[0].Devices.Results[0].Device, &res[0]
}

func TestAllocatorTakesFirstFitInListOrder(t *testing.T) {
	published, err := decidetest.NodeSlices("n", decidetest.NodeOptions{Profile: "h100-80gb:2"})
	if err != nil {
		t.Fatal(err)
	}
	// The same node with its devices in reverse order, slice by slice.
	reversed := make([]*resourceapi.ResourceSlice, len(published))
	for i, s := range published {
		r := s.DeepCopy()
		slices.Reverse(r.Spec.Devices)
		reversed[i] = r
	}
	whole := oneRequestClaim("whole", resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev"})
	for name, f := range decidetest.FeatureSets() {
		t.Run(name, func(t *testing.T) {
			first, _ := allocatedDevice(t, f, allocation.NewState(), published, whole)
			last, _ := allocatedDevice(t, f, allocation.NewState(), reversed, whole)
			if first == last || first != published[0].Spec.Devices[0].Name {
				t.Errorf("first fit in list order no longer holds: took %s in list order and %s in reverse order (first device %s); the placement shortcuts (shortcuts.go) rely on it", first, last, published[0].Spec.Devices[0].Name)
			}
		})
	}
}

func TestAllocatorDerivesCountersFromAllocatedDevices(t *testing.T) {
	published, err := decidetest.NodeSlices("n", decidetest.NodeOptions{Profile: "h100-80gb:2", MIG: true})
	if err != nil {
		t.Fatal(err)
	}
	sizes := migSizes(published)
	mig := func(name string, size int64) *resourceapi.ResourceClaim {
		return oneRequestClaim(name, resourceapi.ExactDeviceRequest{DeviceClassName: "mig.tessera.dev",
			Selectors: []resourceapi.DeviceSelector{memSelector("==", size)}})
	}
	for name, f := range decidetest.FeatureSets() {
		t.Run(name, func(t *testing.T) {
			// The largest MIG device of the first GPU takes all of its
			// counters: with it allocated, a small one goes to the other GPU;
			// without it (the same slices), back to the first GPU.
			big, res := allocatedDevice(t, f, allocation.NewState(), published, mig("big", sizes[len(sizes)-1]))
			gpu, _, _ := strings.Cut(big, "-mig-")
			state := allocation.NewState()
			state.Add(res)
			small, _ := allocatedDevice(t, f, state, published, mig("small", sizes[0]))
			if strings.HasPrefix(small, gpu+"-") {
				t.Errorf("with %s allocated, a small MIG device was taken on the same GPU (%s): counters are no longer derived from the allocated devices; the placement shortcuts (shortcuts.go) rely on it", big, small)
			}
			again, _ := allocatedDevice(t, f, allocation.NewState(), published, mig("small", sizes[0]))
			if !strings.HasPrefix(again, gpu+"-") {
				t.Errorf("with nothing allocated a small MIG device went to %s, not to %s, the first GPU", again, gpu)
			}
		})
	}
}
