package enforce

import (
	"fmt"
	"math"
	"path"
	"path/filepath"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
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

// interposerPlan collects the interposer's limits over a claim's visible
// devices (ModeInterposer).
type interposerPlan struct {
	// used: a device is in interposer mode; preload: the node's library
	// is preloaded for it.
	used, preload bool
	// memLimit (MiB) and smLimit (percent) are every visible device's
	// interposer limits: its allocation in interposer mode, no cap (the
	// device's own memory, 100 %) otherwise. minMem and minSM are the
	// smallest limits, the fallbacks for an index without one.
	memLimit []uint64
	smLimit  []int
	minMem   uint64
	minSM    int
}

// newInterposerPlan starts with no device capped.
func newInterposerPlan(visible []visibleDevice) *interposerPlan {
	ip := &interposerPlan{memLimit: make([]uint64, len(visible)), smLimit: make([]int, len(visible)), minMem: math.MaxUint64, minSM: 100}
	for i, v := range visible {
		ip.memLimit[i], ip.smLimit[i] = max(v.alloc.ReportedTotal, v.alloc.Memory)>>20, 100
	}
	return ip
}

// device plans a device in interposer mode; it returns the memory CUDA
// reports for it (the cap, when the interposer is preloaded).
func (ip *interposerPlan) device(v *visibleDevice, node Node) (reported uint64) {
	a := v.alloc
	ip.used = true
	mib := a.Memory >> 20
	ip.memLimit[v.Index], ip.minMem = mib, min(ip.minMem, mib)
	if a.Cores > 0 && a.Cores < 100 {
		ip.smLimit[v.Index], ip.minSM = a.Cores, min(ip.minSM, a.Cores)
	}
	if node.InterposerLibrary == "" {
		v.Note = "the node has no interposer library (--interposer-library); the limits take effect only if the image preloads one"
		return a.ReportedTotal
	}
	ip.preload = true
	v.Enforced = Interposer
	// The interposer reports the cap as the device's total.
	return a.Memory
}

// apply appends the interposer's variables to env and its mounts to res
// when a device is in interposer mode: the limits, the claim's accounting
// directory and, when the node has the library, its preload.
func (ip *interposerPlan) apply(env []string, res *Result, claim Claim, node Node, accountingHostDir string) []string {
	if !ip.used {
		return env
	}
	// Every variable the interposer reads is set, so that none comes
	// from the pod or the image (HAMiCoreVersion's getenv calls; only
	// LIBCUDA_LOG_LEVEL, logging, is left): a limit for every visible
	// index (a device the interposer does not cap gets its own size
	// and 100 %), the fallbacks it reads for an index without one (the
	// smallest limit), the compute policy, which the pod could
	// otherwise set to "disable" to switch the compute limiter off,
	// and HAMi-core's defaults for the rest. CUDA_REDIRECT goes with
	// the library (below).
	for i, m := range ip.memLimit {
		env = append(env, fmt.Sprintf("%s%d=%dm", EnvMemoryLimitPrefix, i, m))
	}
	env = append(env, fmt.Sprintf("%s=%dm", EnvMemoryLimit, ip.minMem))
	for i, s := range ip.smLimit {
		env = append(env, fmt.Sprintf("%s%d=%d", EnvSMLimitPrefix, i, s))
	}
	env = append(env, fmt.Sprintf("%s=%d", EnvSMLimit, ip.minSM), EnvCoreUtilizationPolicy+"=force",
		EnvActiveOOMKiller+"=true", EnvTaskPriority+"=1", EnvRecordKernelInterval+"=1")
	res.AccountingDir = accountingHostDir
	containerDir := path.Join(AccountingRoot, claim.UID)
	env = append(env, fmt.Sprintf("%s=%s/vgpu-%s.cache", EnvSharedCache, containerDir, claim.ShareKey))
	res.Mounts = append(res.Mounts, &cdispec.Mount{
		HostPath:      accountingHostDir,
		ContainerPath: containerDir,
		Options:       []string{"rw", "nosuid", "nodev", "noexec", "bind"},
	})
	if !ip.preload {
		return env
	}
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
	return env
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
