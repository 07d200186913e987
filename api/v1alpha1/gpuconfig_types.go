package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GpuConfigKind is the kind of the opaque device configuration of driver
// gpu.tessera.dev, carried in DeviceClass.spec.config and
// ResourceClaim.spec.devices.config:
//
//	config:
//	- opaque:
//	    driver: gpu.tessera.dev
//	    parameters:
//	      apiVersion: tessera.dev/v1alpha1
//	      kind: GpuConfig
//	      enforcement: interposer
//	      timeSliceInterval: Short
//	      frameworkCaps: [pytorch]
const GpuConfigKind = "GpuConfig"

// EnforcementMode selects what enforces a memory share or time-slice
// partition inside the container. MIG partitions are isolated by the
// hardware and whole GPUs are exclusive, so neither needs enforcement and
// both ignore this field.
type EnforcementMode string

// Enforcement modes.
const (
	// EnforcementAuto picks the strongest mechanism the node offers for the
	// device: the CUDA interposer when the node has one
	// (--interposer-library), else MPS when an MPS control daemon serves the
	// GPU (--mps-pipe-dir), else none. It is the default.
	EnforcementAuto EnforcementMode = "auto"
	// EnforcementNone enforces nothing: the limits are only accounted and
	// told to the workload (TESSERA_* variables).
	EnforcementNone EnforcementMode = "none"
	// EnforcementInterposer sets the variables of a HAMi-core compatible
	// CUDA interposer (CUDA_DEVICE_MEMORY_LIMIT_<i>, CUDA_DEVICE_SM_LIMIT_<i>,
	// a fresh CUDA_DEVICE_MEMORY_SHARED_CACHE) and preloads the node's
	// interposer library when it has one.
	EnforcementInterposer EnforcementMode = "interposer"
	// EnforcementMPS sets the CUDA MPS client limits
	// (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)
	// and mounts the pipe directory of the GPU's MPS daemon when one runs.
	EnforcementMPS EnforcementMode = "mps"
)

// EnforcementModes lists the valid enforcement modes.
var EnforcementModes = []EnforcementMode{EnforcementNone, EnforcementInterposer, EnforcementMPS, EnforcementAuto}

// EnforcementFloors lists the valid values of minEnforcement, weakest
// first: none < mps < interposer. MIG devices and exclusive whole GPUs are
// isolated without software and satisfy every floor. See docs/enforcement.md
// for why the interposer ranks above MPS.
var EnforcementFloors = []EnforcementMode{EnforcementNone, EnforcementMPS, EnforcementInterposer}

// FloorRank is the position of a floor in EnforcementFloors (0 for none or
// unset), -1 for a value that is not a floor (auto or unknown).
func FloorRank(m EnforcementMode) int {
	if m == "" {
		return 0
	}
	for i, f := range EnforcementFloors {
		if f == m {
			return i
		}
	}
	return -1
}

// MaxFloor returns the stronger of two floors; unset counts as none.
func MaxFloor(a, b EnforcementMode) EnforcementMode {
	if a == "" || FloorRank(b) > FloorRank(a) {
		return b
	}
	return a
}

// TimeSliceInterval is the scheduling time slice of a whole physical GPU
// (nvidia-smi compute-policy --set-timeslice). It is a property of the GPU:
// claims on one GPU that ask for different intervals conflict.
type TimeSliceInterval string

// Time-slice intervals, in the order of nvidia-smi's values 0..3.
const (
	TimeSliceDefault TimeSliceInterval = "Default"
	TimeSliceShort   TimeSliceInterval = "Short"
	TimeSliceMedium  TimeSliceInterval = "Medium"
	TimeSliceLong    TimeSliceInterval = "Long"
)

// TimeSliceIntervals lists the valid intervals; the index is the value
// nvidia-smi takes.
var TimeSliceIntervals = []TimeSliceInterval{TimeSliceDefault, TimeSliceShort, TimeSliceMedium, TimeSliceLong}

// FrameworkCap names a framework-level soft memory cap. Injecting one
// replaces the variable if the pod sets it itself, so caps are opt-in.
type FrameworkCap string

// Framework caps.
const (
	// FrameworkCapPyTorch sets
	// PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:<f>.
	FrameworkCapPyTorch FrameworkCap = "pytorch"
	// FrameworkCapXLA sets XLA_CLIENT_MEM_FRACTION and its older name
	// XLA_PYTHON_CLIENT_MEM_FRACTION to <f>.
	FrameworkCapXLA FrameworkCap = "xla"
)

// FrameworkCaps lists the valid framework caps.
var FrameworkCaps = []FrameworkCap{FrameworkCapPyTorch, FrameworkCapXLA}

// ComputeDefault says what compute (SM) limit a GPU share gets when its
// request does not ask for the `cores` capacity.
type ComputeDefault string

// Compute defaults.
const (
	// ComputeProportional caps a share that does not ask for cores at its
	// memory fraction of the GPU's usable memory, rounded up to a whole
	// percent (at least 1): compute isolation, for platforms that want it
	// (a DeviceClass choice). The scheduler books such a
	// share under `memory` only (its `cores` consumption is the published
	// default, 0); see docs/enforcement.md for what that means for packing.
	ComputeProportional ComputeDefault = "proportional"
	// ComputeUncapped leaves a share that does not ask for cores without
	// an SM limit: it may use the whole GPU's compute next to capped
	// neighbours (work-conserving: an idle neighbour's SMs are used, as
	// on HAMi without gpucores, KAI and the device plugin). It is the
	// default.
	ComputeUncapped ComputeDefault = "uncapped"
)

// ComputeDefaults lists the valid compute defaults.
var ComputeDefaults = []ComputeDefault{ComputeProportional, ComputeUncapped}

// GpuConfig configures how devices of driver gpu.tessera.dev are prepared.
// Configurations apply in this order, later ones overriding the fields
// earlier ones set: DeviceClass config, then claim config for all
// requests, then claim config naming the request.
//
// +kubebuilder:object:root=true
type GpuConfig struct {
	metav1.TypeMeta `json:",inline"`

	// Enforcement selects what enforces a memory share or time-slice
	// partition: auto (default), none, interposer or mps.
	// +optional
	Enforcement EnforcementMode `json:"enforcement,omitempty"`

	// MinEnforcement is the administrator's floor: none, mps or
	// interposer (weakest first). Honoured only in a DeviceClass's
	// configuration; a claim whose own configuration sets it fails to
	// prepare. A device whose effective enforcement is weaker than the
	// floor (the claim asked for less, or the node cannot deliver it: no
	// interposer library, no MPS daemon) fails to prepare. MIG devices and
	// exclusive whole GPUs satisfy every floor. Several class
	// configurations: the strongest floor wins.
	// +optional
	MinEnforcement EnforcementMode `json:"minEnforcement,omitempty"`

	// TimeSliceInterval asks for the GPU's scheduling time slice: Default,
	// Short, Medium or Long. Unset means the claim does not care. The
	// first claim on a GPU that asks for one sets it; a claim asking for a
	// different one while it is set fails to prepare. Ignored for MIG.
	// +optional
	TimeSliceInterval TimeSliceInterval `json:"timeSliceInterval,omitempty"`

	// FrameworkCaps opts in to framework-level soft caps derived from the
	// allocated memory: pytorch, xla. An empty list turns off caps a class
	// configuration asked for; unset inherits them.
	// +optional
	FrameworkCaps []FrameworkCap `json:"frameworkCaps,omitempty"`

	// ComputeDefault is the administrator's choice of the SM limit of a
	// GPU share whose request does not ask for `cores`: uncapped
	// (default; work-conserving) or proportional (its memory fraction of
	// the GPU's usable memory, rounded up to a whole percent). Honoured only in a DeviceClass's
	// configuration; a claim whose own configuration sets it fails to
	// prepare. Applies to shares of whole GPUs, not to time slices, MIG
	// devices or exclusive GPUs. Several class configurations: the last
	// one that sets it wins.
	// +optional
	ComputeDefault ComputeDefault `json:"computeDefault,omitempty"`
}
