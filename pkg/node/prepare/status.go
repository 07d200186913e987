package prepare

import (
	"encoding/json"
	"sort"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/node/checkpoint"
	"github.com/tessera-dev/tessera/pkg/node/enforce"
)

// StatusData is the data a device's entry in status.devices carries.
type StatusData = v1alpha1.DeviceStatus

// StatusDevices are a prepared claim's entries in status.devices, with the
// usage sampled per device (by device name; nil: none yet).
func StatusDevices(driver string, rec *checkpoint.Claim, usage map[string]*v1alpha1.DeviceUsage) []resourceapi.AllocatedDeviceStatus {
	out := make([]resourceapi.AllocatedDeviceStatus, 0, len(rec.Devices))
	for _, d := range rec.Devices {
		cores := d.Cores
		if cores == 0 || d.Enforced == string(enforce.Hard) {
			cores = 100
		}
		data := StatusData{
			UUID: d.UUID, GPUUUID: d.GPUUUID,
			MemoryLimit: *resource.NewQuantity(int64(d.Memory), resource.BinarySI), MemoryLimitBytes: d.Memory,
			ComputeLimit: cores, Enforcement: d.Mode, Enforced: d.Enforced, TimeSliceInterval: d.TimeSliceInterval,
		}
		if d.MIG != nil {
			data.MIGProfile = d.MIG.Profile
		}
		data.Usage = usage[d.Device]
		raw, _ := json.Marshal(data)
		s := resourceapi.AllocatedDeviceStatus{Driver: driver, Pool: d.Pool, Device: d.Device, Data: &runtime.RawExtension{Raw: raw}}
		if d.ShareID != "" {
			share := d.ShareID
			s.ShareID = &share
		}
		out = append(out, s)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Device < out[j].Device })
	return out
}
