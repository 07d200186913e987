package health

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

// Taint keys, one per cause. A device carries at most one taint per key;
// the value names the event (ValueXID or ValueLost).
const (
	// KeyGPULost: the GPU fell off the bus (XID 79) or stopped answering
	// NVML (ERROR_GPU_IS_LOST). Fatal.
	KeyGPULost = devicemodel.DriverName + "/gpu-lost"
	// KeyECC: an uncorrectable ECC error (double-bit ECC event, XID 48,
	// contained 94 or uncontained 95). Fatal.
	KeyECC = devicemodel.DriverName + "/ecc-uncorrectable"
	// KeyXID: any other critical XID. Fatal.
	KeyXID = devicemodel.DriverName + "/xid"
	// KeyAppXID: an XID that NVIDIA attributes to an application, not the
	// GPU (--health-ignored-xids). Informational: effect None, the device
	// stays healthy.
	KeyAppXID = devicemodel.DriverName + "/app-xid"
)

// ValueLost is the value of KeyGPULost when NVML said the GPU is lost
// without an XID.
const ValueLost = "nvml-gpu-lost"

// ValueXID is a taint value naming an XID ("xid-79").
func ValueXID(xid uint64) string { return fmt.Sprintf("xid-%d", xid) }

// xidLost is the XID of a GPU that fell off the bus; xidDBE stands for
// the double-bit ECC event, which NVML reports without an XID.
const (
	xidLost = 79
	xidDBE  = 48
)

var eccXIDs = map[uint64]bool{48: true, 94: true, 95: true}

// Classify returns the taint key of an XID and whether it is fatal (the
// device is unhealthy); ignored are the application XIDs.
func Classify(xid uint64, ignored map[uint64]bool) (key string, fatal bool) {
	switch {
	case ignored[xid]:
		return KeyAppXID, false
	case xid == xidLost:
		return KeyGPULost, true
	case eccXIDs[xid]:
		return KeyECC, true
	default:
		return KeyXID, true
	}
}

// ParseFatalEffect reads --health-fatal-effect: NoSchedule (also when
// empty) or NoExecute.
func ParseFatalEffect(s string) (resourceapi.DeviceTaintEffect, error) {
	if s == "" {
		return resourceapi.DeviceTaintEffectNoSchedule, nil
	}
	switch e := resourceapi.DeviceTaintEffect(s); e {
	case resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute:
		return e, nil
	}
	return "", fmt.Errorf("health taint effect %q: use %s or %s", s, resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute)
}
