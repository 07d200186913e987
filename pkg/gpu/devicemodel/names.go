package devicemodel

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// DriverName is the DRA driver name users see in DeviceClasses and claims.
const DriverName = "gpu.tessera.dev"

// Device types, the value of the `type` attribute.
const (
	TypeGPU       = "gpu"
	TypeTimeSlice = "timeslice"
	TypeMIG       = "mig"
)

// GPUDeviceName is the device of a whole GPU (also shared by memory shares).
func GPUDeviceName(index int) string { return fmt.Sprintf("gpu-%d", index) }

// TimeSliceDeviceName is the k-th time-slice partition of GPU index.
func TimeSliceDeviceName(index, k int) string { return fmt.Sprintf("gpu-%d-ts-%d", index, k) }

// MIGDeviceName is a MIG partition of profile at the given placement start.
func MIGDeviceName(index int, profile string, start int) string {
	return fmt.Sprintf("gpu-%d-mig-%s-%d", index, ProfileToken(profile), start)
}

// ProfileToken turns a MIG profile name into the part of a device name:
// dots removed and "+" replaced by "-", e.g. 1g.10gb -> 1g10gb,
// 1g.10gb+me -> 1g10gb-me (device names must be DNS labels).
func ProfileToken(profile string) string {
	return strings.ReplaceAll(strings.ReplaceAll(profile, ".", ""), "+", "-")
}

// CounterSetName is the shared counter set of GPU index.
func CounterSetName(index int) string { return fmt.Sprintf("gpu-%d-counters", index) }

// Name is a parsed device name.
type Name struct {
	Type  string
	Index int
	// Slice is the time-slice number k for timeslice devices.
	Slice int
	// ProfileToken and Start identify a MIG device.
	ProfileToken string
	Start        int
}

var (
	gpuRE = regexp.MustCompile(`^gpu-(\d+)$`)
	tsRE  = regexp.MustCompile(`^gpu-(\d+)-ts-(\d+)$`)
	migRE = regexp.MustCompile(`^gpu-(\d+)-mig-([0-9a-z-]+)-(\d+)$`)
)

// ParseName parses a device name published by this driver.
func ParseName(device string) (Name, error) {
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	if m := gpuRE.FindStringSubmatch(device); m != nil {
		return Name{Type: TypeGPU, Index: atoi(m[1])}, nil
	}
	if m := tsRE.FindStringSubmatch(device); m != nil {
		return Name{Type: TypeTimeSlice, Index: atoi(m[1]), Slice: atoi(m[2])}, nil
	}
	if m := migRE.FindStringSubmatch(device); m != nil {
		return Name{Type: TypeMIG, Index: atoi(m[1]), ProfileToken: m[2], Start: atoi(m[3])}, nil
	}
	return Name{}, fmt.Errorf("device %q is not a %s device name (gpu-<i>, gpu-<i>-ts-<k> or gpu-<i>-mig-<profile>-<start>)", device, DriverName)
}
