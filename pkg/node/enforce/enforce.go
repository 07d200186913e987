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
	"os"
	"path"
	"path/filepath"
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

// HAMiCoreVersion is the HAMi-core revision whose inputs (environment
// variables and files, docs/enforcement.md "What a container can change")
// the plugin sets or masks.
const HAMiCoreVersion = "8f3a89c67b037d8fdfe6c4cd4d8c4f0cd6504811"

// HAMiCoreEnv are the environment variables HAMiCoreVersion's src/ reads
// (every getenv; "<i>" stands for a device index 0-15). In interposer mode
// the claim's CDI spec sets every one of them but LIBCUDA_LOG_LEVEL
// (logging); admission refuses them in a claim user's env, except
// HAMiCoreEnvAllowed.
var HAMiCoreEnv = []string{
	EnvMemoryLimit, EnvMemoryLimitPrefix + "<i>", EnvSMLimit, EnvSMLimitPrefix + "<i>", // multiprocess_memory_limit.c
	EnvSharedCache, EnvCoreUtilizationPolicy, EnvActiveOOMKiller, EnvTaskPriority, EnvRecordKernelInterval, // multiprocess_memory_limit.c
	EnvCUDARedirect,       // libvgpu.c
	EnvCudaVisibleDevices, // utils.c
	"LIBCUDA_LOG_LEVEL",   // log_utils.c
}

// HAMiCoreEnvAllowed are the HAMiCoreEnv a pod may still set: the CDI
// value replaces CUDA_VISIBLE_DEVICES's (many images and scripts set it;
// refusing it would buy nothing), and LIBCUDA_LOG_LEVEL only sets how much
// HAMi-core logs.
var HAMiCoreEnvAllowed = []string{EnvCudaVisibleDevices, "LIBCUDA_LOG_LEVEL"}

// maxInterposerDevices is how many per-device variables the interposer reads.
const maxInterposerDevices = 16

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

// mpsDaemon returns the pipe directory of the MPS daemon serving a GPU.
func (n Node) mpsDaemon(gpuUUID string) (string, bool) {
	if n.MPSPipeDir == "" {
		return "", false
	}
	for _, dir := range []string{filepath.Join(n.MPSPipeDir, gpuUUID), n.MPSPipeDir} {
		if _, err := os.Stat(filepath.Join(dir, "control")); err == nil {
			return dir, true
		}
	}
	return "", false
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
// is where the claim's fresh accounting directory lives on the host.
func Plan(claim Claim, allocs []Allocation, node Node, accountingHostDir string) (*Result, error) {
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
	res := &Result{}
	var (
		uuids, modes, levels, names, mems, cores []string
		interposer, preload                      bool
		mpsPinned                                []string
		mpsThreads                               = 0
		mpsDir                                   string
		fraction                                 = math.Inf(1)
		wantCaps                                 = map[v1alpha1.FrameworkCap]bool{}
		// memLimit and smLimit are every visible device's interposer
		// limits: its allocation in interposer mode, no cap otherwise.
		memLimit, smLimit = make([]uint64, len(visible)), make([]int, len(visible))
		minMem, minSM     = uint64(math.MaxUint64), 100
	)
	for i := range visible {
		v := &visible[i]
		a := v.alloc
		v.Index = i
		mode := effectiveMode(a, node)
		v.Mode, v.Enforced = mode, Advisory
		reported := a.ReportedTotal
		mib := a.Memory >> 20
		// Not capped by the interposer: the device's own memory.
		memLimit[i], smLimit[i] = max(a.ReportedTotal, a.Memory)>>20, 100
		switch mode {
		case ModeMIG, ModeExclusive:
			v.Enforced = Hard
		case ModeInterposer:
			interposer = true
			memLimit[i], minMem = mib, min(minMem, mib)
			if a.Cores > 0 && a.Cores < 100 {
				smLimit[i], minSM = a.Cores, min(minSM, a.Cores)
			}
			if node.InterposerLibrary != "" {
				preload = true
				v.Enforced = Interposer
				// The interposer reports the cap as the device's total.
				reported = a.Memory
			} else {
				v.Note = "the node has no interposer library (--interposer-library); the limits take effect only if the image preloads one"
			}
		case ModeMPS:
			mpsPinned = append(mpsPinned, fmt.Sprintf("%d=%dM", i, mib))
			if a.Cores > 0 && a.Cores < 100 && (mpsThreads == 0 || a.Cores < mpsThreads) {
				mpsThreads = a.Cores
			}
			if node.MPSPerClaim {
				if res.MPS == nil {
					res.MPS = &mps.Limits{}
				}
				res.MPS.Devices = append(res.MPS.Devices, mps.Device{UUID: a.UUID, MemMiB: mib})
				mpsDir = claim.MPSPipeDir
				v.Enforced = MPS
			} else if dir, ok := node.mpsDaemon(a.GPUUUID); ok {
				if mpsDir != "" && mpsDir != dir {
					return nil, fmt.Errorf("devices %s are served by different MPS daemons (%s and %s); one claim in mps mode can use only one daemon", strings.Join(deviceNames(visible), ", "), mpsDir, dir)
				}
				mpsDir = dir
				v.Enforced = MPS
			} else {
				v.Note = "no MPS daemon serves this GPU (--mps-pipe-dir); the MPS limits take effect only under a daemon"
			}
		}
		if err := checkFloor(*v, a, node); err != nil {
			return nil, err
		}
		for _, fc := range a.Config.FrameworkCaps {
			wantCaps[fc] = true
		}
		if reported > 0 {
			fraction = min(fraction, float64(a.Memory)/float64(reported))
		}
		uuids = append(uuids, v.UUID)
		modes = append(modes, string(v.Mode))
		levels = append(levels, string(v.Enforced))
		names = append(names, strings.Join(v.Devices, "+"))
		mems = append(mems, strconv.FormatUint(a.Memory, 10))
		c := a.Cores
		if c == 0 || v.Mode == ModeMIG || v.Mode == ModeExclusive {
			c = 100
		}
		v.Memory, v.Cores = a.Memory, c
		cores = append(cores, strconv.Itoa(c))
	}
	env := []string{
		EnvNvidiaVisibleDevices + "=" + strings.Join(uuids, ","),
		EnvCudaVisibleDevices + "=" + strings.Join(uuids, ","),
	}
	if interposer {
		// Every variable the interposer reads is set, so that none comes
		// from the pod or the image (HAMiCoreVersion's getenv calls; only
		// LIBCUDA_LOG_LEVEL, logging, is left): a limit for every visible
		// index (a device the interposer does not cap gets its own size
		// and 100 %), the fallbacks it reads for an index without one (the
		// smallest limit), the compute policy, which the pod could
		// otherwise set to "disable" to switch the compute limiter off,
		// and HAMi-core's defaults for the rest. CUDA_REDIRECT goes with
		// the library (below).
		for i := range visible {
			env = append(env, fmt.Sprintf("%s%d=%dm", EnvMemoryLimitPrefix, i, memLimit[i]))
		}
		env = append(env, fmt.Sprintf("%s=%dm", EnvMemoryLimit, minMem))
		for i := range visible {
			env = append(env, fmt.Sprintf("%s%d=%d", EnvSMLimitPrefix, i, smLimit[i]))
		}
		env = append(env, fmt.Sprintf("%s=%d", EnvSMLimit, minSM), EnvCoreUtilizationPolicy+"=force",
			EnvActiveOOMKiller+"=true", EnvTaskPriority+"=1", EnvRecordKernelInterval+"=1")
		res.AccountingDir = accountingHostDir
		containerDir := path.Join(AccountingRoot, claim.UID)
		env = append(env, fmt.Sprintf("%s=%s/vgpu-%s.cache", EnvSharedCache, containerDir, claim.ShareKey))
		res.Mounts = append(res.Mounts, &cdispec.Mount{
			HostPath:      accountingHostDir,
			ContainerPath: containerDir,
			Options:       []string{"rw", "nosuid", "nodev", "noexec", "bind"},
		})
	}
	if preload {
		lib := path.Join(InterposerDir, filepath.Base(node.InterposerLibrary))
		// LD_PRELOAD stays for tools that read it; the loader is held to
		// the library by the read-only preload list, which a process
		// that unsets LD_PRELOAD (or an exec with a fresh environment)
		// cannot drop.
		env = append(env, EnvLDPreload+"="+lib, EnvCUDARedirect+"="+lib)
		res.Mounts = append(res.Mounts, &cdispec.Mount{
			HostPath:      node.InterposerLibrary,
			ContainerPath: lib,
			Options:       []string{"ro", "nosuid", "nodev", "bind"},
		}, &cdispec.Mount{
			HostPath:      hostNull,
			ContainerPath: OverrideEnvFile,
			Options:       []string{"ro", "nosuid", "noexec", "bind"},
		})
		if claim.PreloadFile != "" {
			res.PreloadFile, res.PreloadContent = claim.PreloadFile, PreloadList(lib)
			res.Mounts = append(res.Mounts, &cdispec.Mount{
				HostPath:      claim.PreloadFile,
				ContainerPath: LDSoPreload,
				Options:       []string{"ro", "nosuid", "nodev", "noexec", "bind"},
			})
		}
	}
	if res.MPS != nil {
		res.MPS.ThreadPercent = mpsThreads
		if claim.MPSPipeDir == "" {
			return nil, fmt.Errorf("claim %s/%s: no pipe directory for its MPS daemon", claim.Namespace, claim.Name)
		}
	}
	if len(mpsPinned) > 0 {
		// Client-side limits too: the daemon's defaults are what a
		// tenant cannot raise; these only restate them.
		env = append(env, EnvMPSPinnedMem+"="+strings.Join(mpsPinned, ","))
		if mpsThreads > 0 {
			env = append(env, fmt.Sprintf("%s=%d", EnvMPSThreads, mpsThreads))
		}
		if mpsDir != "" {
			env = append(env, EnvMPSPipe+"="+MPSPipeDir)
			res.Mounts = append(res.Mounts, &cdispec.Mount{
				HostPath:      mpsDir,
				ContainerPath: MPSPipeDir,
				Options:       []string{"rw", "nosuid", "nodev", "bind"},
			})
		}
	}
	if !math.IsInf(fraction, 1) {
		f := formatFraction(fraction)
		if wantCaps[v1alpha1.FrameworkCapPyTorch] {
			env = append(env, EnvPyTorchAllocConf+"=per_process_memory_fraction:"+f)
		}
		if wantCaps[v1alpha1.FrameworkCapXLA] {
			env = append(env, EnvXLAFraction+"="+f, EnvXLAPythonFraction+"="+f)
		}
	}
	env = append(env,
		EnvTesseraClaim+"="+claim.Namespace+"/"+claim.Name,
		EnvTesseraDevice+"="+strings.Join(names, ","),
		EnvTesseraUUID+"="+strings.Join(uuids, ","),
		EnvTesseraMode+"="+strings.Join(modes, ","),
		EnvTesseraEnforced+"="+strings.Join(levels, ","),
		EnvTesseraMemoryLimit+"="+strings.Join(mems, ","),
		EnvTesseraComputeLimit+"="+strings.Join(cores, ","),
	)
	res.Env = env
	for _, v := range visible {
		res.Visible = append(res.Visible, v.Visible)
	}
	return res, nil
}

// PreloadList is the content of a claim's preload file naming the
// libraries at their container paths, one a line.
func PreloadList(libs ...string) []byte {
	return []byte(strings.Join(libs, "\n") + "\n")
}

// PreloadListFromSpec rebuilds a claim's preload file from the CDI spec it
// was written with (its LD_PRELOAD), to restore a file that went missing;
// false when the spec preloads nothing.
func PreloadListFromSpec(spec *cdispec.Spec) ([]byte, bool) {
	if spec == nil {
		return nil, false
	}
	for _, e := range spec.ContainerEdits.Env {
		if v, ok := strings.CutPrefix(e, EnvLDPreload+"="); ok && v != "" {
			return PreloadList(strings.Split(v, ":")...), true
		}
	}
	return nil, false
}

// formatFraction rounds down to three decimals so a cap never exceeds the
// allocation.
func formatFraction(f float64) string {
	f = math.Floor(min(f, 1)*1000) / 1000
	return strconv.FormatFloat(f, 'f', 3, 64)
}

// levelRank places what enforces a device on the floor's scale
// (v1alpha1.EnforcementFloors): advisory is none.
func levelRank(l Level) int {
	switch l {
	case Interposer:
		return v1alpha1.FloorRank(v1alpha1.EnforcementInterposer)
	case MPS:
		return v1alpha1.FloorRank(v1alpha1.EnforcementMPS)
	}
	return 0
}

// modeRank is the best a mode can deliver on any node, on the floor's
// scale.
func modeRank(m Mode) int {
	switch m {
	case ModeInterposer:
		return levelRank(Interposer)
	case ModeMPS:
		return levelRank(MPS)
	}
	return 0
}

// checkFloor fails a device whose effective enforcement is weaker than the
// stronger of its class's floor and the node's. MIG devices and exclusive
// GPUs are isolated without software and satisfy every floor. The error
// says who set the floor and whether the claim asked for less or the node
// cannot deliver it.
func checkFloor(v visibleDevice, a Allocation, node Node) error {
	if v.Mode == ModeMIG || v.Mode == ModeExclusive {
		return nil
	}
	floor := v1alpha1.MaxFloor(a.Config.MinEnforcement, node.MinEnforcement)
	want := v1alpha1.FloorRank(floor)
	if want <= 0 || levelRank(v.Enforced) >= want {
		return nil
	}
	who := "its DeviceClass (minEnforcement)"
	if v1alpha1.FloorRank(node.MinEnforcement) >= v1alpha1.FloorRank(a.Config.MinEnforcement) {
		who = "this node (--min-enforcement)"
	}
	dev := strings.Join(v.Devices, "+")
	asked := a.Config.Enforcement
	if asked != v1alpha1.EnforcementAuto && modeRank(v.Mode) < want {
		return fmt.Errorf("device %s: enforcement %s is weaker than the floor %s set by %s; refusing to prepare: use enforcement %s or auto",
			dev, asked, floor, who, floor)
	}
	missing := "no interposer library (--interposer-library)"
	if floor == v1alpha1.EnforcementMPS && v.Mode != ModeInterposer {
		missing = fmt.Sprintf("no MPS daemon for GPU %s (--mps-control for one per claim, or --mps-pipe-dir)", a.GPUUUID)
	}
	return fmt.Errorf("device %s: the floor %s set by %s cannot be delivered on this node: enforcement %s resolved to %s and the node has %s; refusing to prepare",
		dev, floor, who, asked, v.Mode, missing)
}

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

func deviceNames(v []visibleDevice) []string {
	var out []string
	for _, d := range v {
		out = append(out, d.Devices...)
	}
	return out
}
