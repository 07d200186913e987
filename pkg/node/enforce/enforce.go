// Package enforce turns what a claim was ALLOCATED (consumed capacity, the
// memory of a time-slice partition or MIG device) into the container
// environment and mounts that enforce it, never what the pod asked for.
//
// Per visible device the effective mode is:
//   - mig: a MIG device; the hardware isolates it, nothing to set;
//   - exclusive: a whole GPU (the share consumed all usable memory), nobody
//     else can be placed on it, nothing to set;
//   - interposer: HAMi-core compatible variables (CUDA_DEVICE_MEMORY_LIMIT_<i>
//     in MiB with the single suffix "m", CUDA_DEVICE_SM_LIMIT_<i>) and a fresh
//     CUDA_DEVICE_MEMORY_SHARED_CACHE per claim and share; the node's
//     interposer library is mounted and preloaded when it has one, through
//     the claim's own ld.so.preload file mounted read-only over
//     /etc/ld.so.preload (which a process cannot unset) and LD_PRELOAD;
//   - mps: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (<i>=<MiB>M) and
//     CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, plus the pipe directory of the
//     claim's own MPS daemon (Node.MPSPerClaim; its daemon-side limits are
//     returned in Result.MPS) or of the GPU's node daemon when one runs;
//   - none: nothing enforces the limit; it is only accounted and told.
//
// "auto" (the default) resolves to interposer when the node has an
// interposer library, else to mps when an MPS daemon serves the GPU (or the
// node runs one per claim), else to none. A device whose effective
// enforcement is below the class's or node's floor (minEnforcement) fails. TESSERA_* variables always tell the workload its mode, devices,
// limits and what actually enforces them.
package enforce

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/node/mps"
)

// Mode is the effective enforcement mode of one visible device.
type Mode string

// Effective modes.
const (
	ModeMIG        Mode = "mig"
	ModeExclusive  Mode = "exclusive"
	ModeInterposer Mode = "interposer"
	ModeMPS        Mode = "mps"
	ModeNone       Mode = "none"
)

// Level says what actually enforces a device's limits.
type Level string

// Enforcement levels, as TESSERA_ENFORCED reports them.
const (
	// Hard: hardware partition (MIG) or an exclusive whole GPU.
	Hard Level = "hard"
	// Interposer: the node's CUDA interposer is preloaded (cooperative,
	// user space).
	Interposer Level = "interposer"
	// MPS: an MPS daemon serves the GPU and the client limits are set (per
	// process, not per container).
	MPS Level = "mps"
	// Advisory: nothing on the node enforces the limit; the variables tell
	// the workload (and framework caps, when opted in, ask the framework).
	Advisory Level = "advisory"
)

// Container paths of what the plugin mounts.
const (
	// InterposerDir holds the node's interposer library in the container.
	InterposerDir = "/usr/local/tessera/lib"
	// AccountingRoot holds per-claim accounting directories.
	AccountingRoot = "/run/tessera"
	// MPSPipeDir is where the MPS daemon's pipe directory is mounted.
	MPSPipeDir = "/tmp/nvidia-mps"
	// LDSoPreload is the dynamic loader's preload list, where the claim's
	// preload file is mounted: glibc's ld.so loads what it names into
	// every dynamically linked process, whatever its environment.
	LDSoPreload = "/etc/ld.so.preload"
	// OverrideEnvFile is a file HAMi-core reads as KEY=VALUE lines and
	// setenv()s over the process's environment when it hooks NVML (its
	// ENV_OVERRIDE_FILE): an image could carry one that raises the limits
	// or switches the compute limiter off in the processes (and children)
	// that read it. The spec masks it with the host's /dev/null,
	// read-only, as runtimes mask paths.
	OverrideEnvFile = "/overrideEnv"
	// hostNull is what OverrideEnvFile is masked with.
	hostNull = "/dev/null"
)

// Variables the plugin sets. The formats are what the consumers parse.
const (
	EnvNvidiaVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	EnvCudaVisibleDevices   = "CUDA_VISIBLE_DEVICES"
	EnvMemoryLimitPrefix    = "CUDA_DEVICE_MEMORY_LIMIT_"
	EnvMemoryLimit          = "CUDA_DEVICE_MEMORY_LIMIT"
	EnvSMLimitPrefix        = "CUDA_DEVICE_SM_LIMIT_"
	EnvSMLimit              = "CUDA_DEVICE_SM_LIMIT"
	// EnvCoreUtilizationPolicy is HAMi-core's compute policy: "force"
	// throttles to CUDA_DEVICE_SM_LIMIT_<i> always; "disable" turns the
	// compute limiter off.
	EnvCoreUtilizationPolicy = "GPU_CORE_UTILIZATION_POLICY"
	EnvSharedCache           = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
	EnvLDPreload             = "LD_PRELOAD"
	EnvMPSPinnedMem          = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	EnvMPSThreads            = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	EnvMPSPipe               = "CUDA_MPS_PIPE_DIRECTORY"
	EnvPyTorchAllocConf      = "PYTORCH_CUDA_ALLOC_CONF"
	EnvXLAFraction           = "XLA_CLIENT_MEM_FRACTION"
	EnvXLAPythonFraction     = "XLA_PYTHON_CLIENT_MEM_FRACTION"
	EnvTesseraMode           = "TESSERA_MODE"
	EnvTesseraEnforced       = "TESSERA_ENFORCED"
	EnvTesseraDevice         = "TESSERA_DEVICE"
	EnvTesseraUUID           = "TESSERA_UUID"
	EnvTesseraMemoryLimit    = "TESSERA_MEMORY_LIMIT"
	EnvTesseraComputeLimit   = "TESSERA_COMPUTE_LIMIT"
	EnvTesseraClaim          = "TESSERA_CLAIM"
	// EnvCUDARedirect names the library whose cu* symbols HAMi-core's
	// dlsym hands out (default /usr/local/vgpu/libvgpu.so, which an image
	// could fill with the real driver's): set to the interposer itself.
	EnvCUDARedirect = "CUDA_REDIRECT"
	// HAMi-core's other inputs, set to HAMi-core's own defaults so that
	// neither the pod nor the image sets them: whether it kills a process
	// over its limit, the task priority in the claim's shared region, and
	// how often it records kernel launches for the compute limiter.
	EnvActiveOOMKiller      = "ACTIVE_OOM_KILLER"
	EnvTaskPriority         = "CUDA_TASK_PRIORITY"
	EnvRecordKernelInterval = "RECORD_KERNEL_INTERVAL"
)

// Node is what the node offers for enforcement.
type Node struct {
	// InterposerLibrary is the host path of a HAMi-core compatible
	// interposer (--interposer-library); empty when the node has none.
	InterposerLibrary string
	// MPSPipeDir is the host directory of the node's MPS control daemons
	// (--mps-pipe-dir): a GPU is served when <dir>/<gpu-uuid>/control or,
	// for a daemon serving all GPUs, <dir>/control exists.
	MPSPipeDir string
	// MinEnforcement is the node's floor (--min-enforcement): none, mps or
	// interposer. A class's floor (GpuConfig.minEnforcement) adds to it;
	// the stronger applies.
	MinEnforcement v1alpha1.EnforcementMode
	// MPSPerClaim: the plugin starts an MPS control daemon for every claim
	// in mps mode (Claim.MPSPipeDir), with daemon-side limits; node
	// daemons (MPSPipeDir) are then not used.
	MPSPerClaim bool
}

// Allocation is one allocated device of a claim (one allocation result).
type Allocation struct {
	Request string
	// Device is the published device name (gpu-0, gpu-0-ts-1, ...).
	Device string
	// Type is devicemodel.TypeGPU, TypeTimeSlice or TypeMIG.
	Type string
	// UUID is what CUDA addresses: the GPU's or the MIG device's UUID.
	UUID string
	// GPUUUID is the physical GPU's UUID (for MPS daemons).
	GPUUUID string
	// Memory is the allocated memory in bytes: consumedCapacity.memory of a
	// share, the partition's memory for a time slice or MIG device.
	Memory uint64
	// Cores is the allocated compute percent (consumedCapacity.cores);
	// 0 means the request did not ask for cores: ComputeCap then applies
	// the class's computeDefault.
	Cores int
	// Usable is the usable memory of the GPU a share is carved from (the
	// published `memory` capacity), the base of a proportional compute
	// limit; set for devicemodel.TypeGPU.
	Usable uint64
	// Whole is set when the allocation leaves nothing of the GPU to others.
	Whole bool
	// ReportedTotal is the memory CUDA reports for the device without an
	// interposer: the GPU's total, or the MIG device's.
	ReportedTotal uint64
	// Config is the effective, normalized configuration.
	Config *v1alpha1.GpuConfig
}

// Claim identifies the claim being prepared.
type Claim struct {
	Namespace, Name, UID string
	// ShareKey identifies this allocation of the claim (its share IDs); it
	// makes the accounting file path fresh for every allocation.
	ShareKey string
	// MPSPipeDir is the host pipe directory of the claim's own MPS daemon
	// when the node runs one per claim (Node.MPSPerClaim).
	MPSPipeDir string
	// PreloadFile is the host path of the claim's ld.so.preload file,
	// which the caller writes with Result.PreloadContent and which is
	// mounted at LDSoPreload when the interposer is preloaded. Empty: the
	// interposer is preloaded through LD_PRELOAD only.
	PreloadFile string
}

// Visible is one device as the container sees it, at CUDA index Index.
type Visible struct {
	Index    int
	Devices  []string
	UUID     string
	Mode     Mode
	Enforced Level
	Memory   uint64
	Cores    int
	Note     string
}

// Result is what a claim's containers get.
type Result struct {
	Env     []string
	Mounts  []*cdispec.Mount
	Visible []Visible
	// AccountingDir is the host directory to create fresh for the
	// interposer's shared cache; empty when no device uses the interposer.
	AccountingDir string
	// MPS are the daemon-side limits of the claim's own MPS daemon, which
	// the caller starts before the containers do; nil when none is needed.
	MPS *mps.Limits
	// PreloadFile is Claim.PreloadFile when the spec mounts it, and
	// PreloadContent what the caller writes there (atomically, before the
	// spec); both empty when nothing is preloaded.
	PreloadFile    string
	PreloadContent []byte
}

// ComputeCap is the compute (SM) limit in percent that an allocation is
// held to, 0 for none. A share of a whole GPU that asked for cores gets
// what it asked for; one that did not gets its class's computeDefault:
// uncapped (unset counts as uncapped: work-conserving, the default) is 0;
// proportional is its memory fraction of the GPU's usable memory rounded
// up to a whole percent, at least 1. Time slices, MIG devices and exclusive GPUs are not
// capped by this (0 unless cores were allocated).
func ComputeCap(a Allocation) (int, error) {
	if a.Cores != 0 || a.Type != devicemodel.TypeGPU || a.Whole {
		return a.Cores, nil
	}
	if a.Config == nil || a.Config.ComputeDefault != v1alpha1.ComputeProportional {
		return 0, nil // uncapped, the default
	}
	if a.Usable == 0 {
		return 0, fmt.Errorf("device %s: the GPU's usable memory is unknown, so the proportional compute limit (computeDefault) cannot be computed", a.Device)
	}
	if a.Memory == 0 {
		return 0, fmt.Errorf("device %s: a share without memory cannot get a proportional compute limit", a.Device)
	}
	// Rounded up: a share never gets less compute than its memory
	// fraction. Memory <= Usable for a share (or Whole is set).
	pct := (min(a.Memory, a.Usable)*100 + a.Usable - 1) / a.Usable
	return int(max(1, min(pct, 100))), nil
}

// Plan computes the environment and mounts for a claim. accountingHostDir
// is where the claim's fresh accounting directory lives on the host. Each
// visible device is planned by its effective mode (mig.go, interposer.go,
// mps.go); the variables that tell the workload what it got and the
// framework caps cover every device.
func Plan(claim Claim, allocs []Allocation, node Node, accountingHostDir string) (*Result, error) {
	visible, err := visibleDevices(allocs)
	if err != nil {
		return nil, err
	}
	res := &Result{}
	ip := newInterposerPlan(visible)
	var mp mpsPlan
	fw := newFrameworkCaps()
	for i := range visible {
		v := &visible[i]
		v.Index = i
		v.Mode, v.Enforced = effectiveMode(v.alloc, node), Advisory
		reported := v.alloc.ReportedTotal
		switch v.Mode {
		case ModeMIG, ModeExclusive:
			planHard(v)
		case ModeInterposer:
			reported = ip.device(v, node)
		case ModeMPS:
			if err := mp.device(v, claim, node, visible); err != nil {
				return nil, err
			}
		}
		if err := checkFloor(*v, v.alloc, node); err != nil {
			return nil, err
		}
		fw.add(v.alloc, reported)
		c := v.alloc.Cores
		if c == 0 || v.Mode == ModeMIG || v.Mode == ModeExclusive {
			c = 100
		}
		v.Memory, v.Cores = v.alloc.Memory, c
	}
	uuids := strings.Join(column(visible, func(v Visible) string { return v.UUID }), ",")
	env := []string{
		EnvNvidiaVisibleDevices + "=" + uuids,
		EnvCudaVisibleDevices + "=" + uuids,
	}
	env = ip.apply(env, res, claim, node, accountingHostDir)
	if env, err = mp.apply(env, res, claim); err != nil {
		return nil, err
	}
	env = fw.apply(env)
	res.Env = append(env, tesseraEnv(claim, visible)...)
	for _, v := range visible {
		res.Visible = append(res.Visible, v.Visible)
	}
	return res, nil
}

// visibleDevices are the claim's allocations with their compute caps
// (ComputeCap), merged per CUDA device (merge).
func visibleDevices(allocs []Allocation) ([]visibleDevice, error) {
	capped := make([]Allocation, len(allocs))
	for i, a := range allocs {
		c, err := ComputeCap(a)
		if err != nil {
			return nil, err
		}
		a.Cores = c
		capped[i] = a
	}
	visible, err := merge(capped)
	if err != nil {
		return nil, err
	}
	if len(visible) > maxInterposerDevices {
		return nil, fmt.Errorf("claim has %d devices; at most %d per claim are supported", len(visible), maxInterposerDevices)
	}
	return visible, nil
}

// tesseraEnv are the TESSERA_* variables: the claim, and per visible
// device (comma-separated, in CUDA order) its devices, UUID, mode, what
// enforces it and its limits.
func tesseraEnv(claim Claim, visible []visibleDevice) []string {
	list := func(f func(Visible) string) string { return strings.Join(column(visible, f), ",") }
	return []string{
		EnvTesseraClaim + "=" + claim.Namespace + "/" + claim.Name,
		EnvTesseraDevice + "=" + list(func(v Visible) string { return strings.Join(v.Devices, "+") }),
		EnvTesseraUUID + "=" + list(func(v Visible) string { return v.UUID }),
		EnvTesseraMode + "=" + list(func(v Visible) string { return string(v.Mode) }),
		EnvTesseraEnforced + "=" + list(func(v Visible) string { return string(v.Enforced) }),
		EnvTesseraMemoryLimit + "=" + list(func(v Visible) string { return strconv.FormatUint(v.Memory, 10) }),
		EnvTesseraComputeLimit + "=" + list(func(v Visible) string { return strconv.Itoa(v.Cores) }),
	}
}

// column is f of every visible device.
func column(visible []visibleDevice, f func(Visible) string) []string {
	out := make([]string, 0, len(visible))
	for _, v := range visible {
		out = append(out, f(v.Visible))
	}
	return out
}

// frameworkCaps collects the framework memory caps a claim's devices ask
// for (GpuConfig.FrameworkCaps) and the smallest fraction of a device's
// reported memory that the claim may use.
type frameworkCaps struct {
	want     map[v1alpha1.FrameworkCap]bool
	fraction float64
}

// newFrameworkCaps starts with no cap asked for and no fraction.
func newFrameworkCaps() *frameworkCaps {
	return &frameworkCaps{want: map[v1alpha1.FrameworkCap]bool{}, fraction: math.Inf(1)}
}

// add counts a device whose memory CUDA reports as reported (0: unknown).
func (fw *frameworkCaps) add(a Allocation, reported uint64) {
	for _, fc := range a.Config.FrameworkCaps {
		fw.want[fc] = true
	}
	if reported > 0 {
		fw.fraction = min(fw.fraction, float64(a.Memory)/float64(reported))
	}
}

// apply appends the variables of the caps asked for.
func (fw *frameworkCaps) apply(env []string) []string {
	if math.IsInf(fw.fraction, 1) {
		return env
	}
	f := formatFraction(fw.fraction)
	if fw.want[v1alpha1.FrameworkCapPyTorch] {
		env = append(env, EnvPyTorchAllocConf+"=per_process_memory_fraction:"+f)
	}
	if fw.want[v1alpha1.FrameworkCapXLA] {
		env = append(env, EnvXLAFraction+"="+f, EnvXLAPythonFraction+"="+f)
	}
	return env
}

// formatFraction rounds down to three decimals so a cap never exceeds the
// allocation.
func formatFraction(f float64) string {
	f = math.Floor(min(f, 1)*1000) / 1000
	return strconv.FormatFloat(f, 'f', 3, 64)
}

// effectiveMode is the mode a device is enforced in: mig for a MIG device,
// exclusive for a whole GPU, else the configured enforcement, with auto
// resolved on the node (see the package comment).
func effectiveMode(a Allocation, node Node) Mode {
	switch {
	case a.Type == devicemodel.TypeMIG:
		return ModeMIG
	case a.Whole:
		return ModeExclusive
	}
	switch a.Config.Enforcement {
	case v1alpha1.EnforcementNone:
		return ModeNone
	case v1alpha1.EnforcementInterposer:
		return ModeInterposer
	case v1alpha1.EnforcementMPS:
		return ModeMPS
	}
	// auto
	if node.InterposerLibrary != "" {
		return ModeInterposer
	}
	if _, ok := node.mpsDaemon(a.GPUUUID); ok || node.MPSPerClaim {
		return ModeMPS
	}
	return ModeNone
}

// visibleDevice is a visible device with the allocation it stands for
// (merged, with its compute cap).
type visibleDevice struct {
	Visible
	alloc Allocation
}

// merge folds allocations on the same CUDA device (two shares of one GPU
// in one claim) into one visible device whose limits are the sums.
func merge(allocs []Allocation) ([]visibleDevice, error) {
	var out []visibleDevice
	byUUID := map[string]int{}
	for _, a := range allocs {
		if a.Config == nil {
			return nil, fmt.Errorf("device %s: no configuration", a.Device)
		}
		i, ok := byUUID[a.UUID]
		if !ok {
			byUUID[a.UUID] = len(out)
			out = append(out, visibleDevice{Visible: Visible{Devices: []string{a.Device}, UUID: a.UUID}, alloc: a})
			continue
		}
		v := &out[i]
		if v.alloc.Config.Enforcement != a.Config.Enforcement {
			return nil, fmt.Errorf("requests %s and %s share device %s but ask for different enforcement (%s and %s): use one",
				v.alloc.Request, a.Request, a.Device, v.alloc.Config.Enforcement, a.Config.Enforcement)
		}
		v.alloc.Memory += a.Memory
		if v.alloc.Cores == 0 || a.Cores == 0 {
			v.alloc.Cores = 0
		} else {
			v.alloc.Cores = min(100, v.alloc.Cores+a.Cores)
		}
		v.alloc.Whole = v.alloc.Whole || a.Whole
		merged := v.alloc.Config.Merge(&v1alpha1.GpuConfig{MinEnforcement: a.Config.MinEnforcement, FrameworkCaps: append(append([]v1alpha1.FrameworkCap(nil), v.alloc.Config.FrameworkCaps...), a.Config.FrameworkCaps...)})
		merged.Normalize()
		v.alloc.Config = merged
		if a.Device != v.Devices[len(v.Devices)-1] {
			v.Devices = append(v.Devices, a.Device)
		}
	}
	return out, nil
}
