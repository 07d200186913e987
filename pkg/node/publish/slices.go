// Package publish turns the device model into ResourceSlices and keeps the
// published slices in step with the node: at start, on every rescan, and
// whenever the inventory, the configuration or device health changes.
package publish

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

// ResourceSlices renders the slices of one node's pool as the objects the
// kubelet plugin library publishes: pool named after the node, one
// generation, slice names prefixed with their index so that first fit walks
// them in order (the library appends a random suffix; here it is omitted).
func ResourceSlices(nodeName string, slices []resourceslice.Slice) []*resourceapi.ResourceSlice {
	out := make([]*resourceapi.ResourceSlice, 0, len(slices))
	for i, s := range slices {
		out = append(out, &resourceapi.ResourceSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceSlice"},
			ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("%05x-%s-%s", i, devicemodel.DriverName, nodeName),
			},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   devicemodel.DriverName,
				NodeName: ptr.To(nodeName),
				Pool: resourceapi.ResourcePool{
					Name:               nodeName,
					Generation:         1,
					ResourceSliceCount: int64(len(slices)),
				},
				Devices:        s.Devices,
				SharedCounters: s.SharedCounters,
			},
		})
	}
	return out
}
