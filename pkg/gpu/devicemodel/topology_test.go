package devicemodel_test

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

// A claim aligns a GPU share with another driver's NIC through the
// standard attribute resource.kubernetes.io/pcieRoot, placed by the
// scheduler's own allocator: the share lands on a GPU behind the NIC's
// root complex, and with a NIC no GPU shares a root with it does not fit.
func TestShareAlignedWithNICByPCIeRoot(t *testing.T) {
	gpus := buildSlices(t, nodeOpts{profile: "dgxh100"})
	classes := append(shippedClasses(t), &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "nic.example.com"},
		Spec:       resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "nic.example.com"`}}}},
	})
	for _, tc := range []struct {
		nicRoot string
		want    []string // GPUs the share may land on; none: does not fit
	}{
		{"pci0000:30", []string{"gpu-4", "gpu-5"}},
		{"pci0000:10", []string{"gpu-0", "gpu-1"}},
		{"pci0000:f0", nil},
	} {
		t.Run(tc.nicRoot, func(t *testing.T) {
			nics := &resourceapi.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{Name: "nics"},
				Spec: resourceapi.ResourceSliceSpec{
					Driver:   "nic.example.com",
					NodeName: ptr.To(nodeName),
					Pool:     resourceapi.ResourcePool{Name: nodeName, ResourceSliceCount: 1},
					Devices: []resourceapi.Device{{Name: "nic-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
						devicemodel.AttrPCIeRoot: {StringValue: ptr.To(tc.nicRoot)},
					}}},
				},
			}
			c := newClaim(req{class: "gpu.tessera.dev", memory: "10Gi"})
			c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, resourceapi.DeviceRequest{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: "nic.example.com", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			}})
			c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(devicemodel.AttrPCIeRoot))}}
			alloc := allocation.NewAllocator(append(gpus, nics), classes)
			res, err := alloc.Allocate(context.Background(), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, allocation.NewState(), c)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if res != nil {
					t.Fatalf("fit with a NIC behind no GPU's root: %+v", res[0].Devices.Results)
				}
				return
			}
			if res == nil {
				t.Fatal("a 10Gi share aligned with the NIC did not fit")
			}
			gpu := res[0].Devices.Results[0].Device
			if gpu != tc.want[0] && gpu != tc.want[1] {
				t.Errorf("share on %s, want one of %v (behind %s)", gpu, tc.want, tc.nicRoot)
			}
		})
	}
}
