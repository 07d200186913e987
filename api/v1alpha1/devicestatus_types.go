package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DeviceStatus is what the kubelet plugin writes into the data of each of
// its entries in ResourceClaim status.devices: what the container
// addresses, the share it was given, what enforces it and, once sampled,
// what the claim's processes really use. The controller sums Usage per
// queue and `kubectl tessera top` lists it; both read only this type.
type DeviceStatus struct {
	// UUID is what the container addresses: the GPU's or MIG device's UUID.
	UUID    string `json:"uuid"`
	GPUUUID string `json:"gpuUUID,omitempty"`
	// MIGProfile is the MIG profile of a MIG device.
	MIGProfile string `json:"migProfile,omitempty"`
	// MemoryLimit is the device memory the claim may use.
	MemoryLimit      resource.Quantity `json:"memoryLimit"`
	MemoryLimitBytes uint64            `json:"memoryLimitBytes"`
	// ComputeLimit is the compute percent (100 = no cap).
	ComputeLimit int `json:"computeLimit"`
	// Enforcement is the effective mode: mig, exclusive, interposer, mps
	// or none; Enforced what enforces it: hard, interposer, mps, advisory.
	Enforcement       string `json:"enforcement"`
	Enforced          string `json:"enforced"`
	TimeSliceInterval string `json:"timeSliceInterval,omitempty"`
	// Usage is what the claim's processes used on this device at the
	// plugin's last sample that changed it noticeably; absent until the
	// first sample.
	// +optional
	Usage *DeviceUsage `json:"usage,omitempty"`
}

// DeviceUsage is a sample of what a claim's processes use on one device.
type DeviceUsage struct {
	// MemoryUsedBytes is the device memory the claim's processes hold.
	MemoryUsedBytes uint64 `json:"memoryUsedBytes"`
	// SMUtilizationPercent is the claim's share of the device's SMs over
	// the last sampling interval (0-100, of the whole device).
	SMUtilizationPercent int `json:"smUtilizationPercent"`
	// Processes is the number of the claim's processes on the device.
	Processes int `json:"processes"`
	// SampledAt is when the sample was taken.
	SampledAt metav1.Time `json:"sampledAt"`
}
