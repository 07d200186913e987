package nvmlmock

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Process is a simulated compute process on a GPU or MIG device.
type Process struct {
	PID uint32
	// UsedMemory is the device memory it holds, in bytes.
	UsedMemory uint64
	// SMUtil is its share of the device's SMs, in percent.
	SMUtil uint32
}

// Environment variables a host process sets to be simulated as a compute
// process (Options.ProcRoot): the mock's stand-in for a CUDA program.
// They are fixtures of the mock, read by nothing on a real node.
const (
	// EnvMemoryUsed is the device memory the process "uses" (a quantity:
	// 1Gi, 512Mi) on the device in its NVIDIA_VISIBLE_DEVICES.
	EnvMemoryUsed = "MOCK_GPU_MEMORY_USED"
	// EnvSMUtil is its SM utilization in percent (default 0).
	EnvSMUtil = "MOCK_GPU_SM_UTILIZATION"
)

// procScanTTL bounds how often the host's processes are scanned: one
// sampling pass queries every device within it.
const procScanTTL = time.Second

// SetProcesses replaces the simulated processes of a device, a GPU or MIG
// device by UUID; nil removes them.
func (s *Server) SetProcesses(uuid string, procs []Process) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.procs == nil {
		s.procs = map[string][]Process{}
	}
	if procs == nil {
		delete(s.procs, uuid)
		return
	}
	s.procs[uuid] = append([]Process(nil), procs...)
}

// processes returns the processes on a device: those set with
// SetProcesses and, with Options.ProcRoot, the host processes that ask for
// it through EnvMemoryUsed.
func (s *Server) processes(uuid string) []Process {
	s.mu.Lock()
	out := append([]Process(nil), s.procs[uuid]...)
	root := s.opts.ProcRoot
	s.mu.Unlock()
	if root == "" {
		return out
	}
	return append(out, s.scanned()[uuid]...)
}

// scanned returns the host's simulated processes by device UUID, scanning
// at most once per procScanTTL.
func (s *Server) scanned() map[string][]Process {
	s.scanMu.Lock()
	defer s.scanMu.Unlock()
	if s.scan != nil && time.Since(s.scanAt) < procScanTTL {
		return s.scan
	}
	s.scan, s.scanAt = scanProcs(s.opts.ProcRoot), time.Now()
	return s.scan
}

func scanProcs(root string) map[string][]Process {
	out := map[string][]Process{}
	entries, err := os.ReadDir(root)
	if err != nil {
		return out
	}
	for _, e := range entries {
		pid, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join(root, e.Name(), "environ"))
		if err != nil || !bytes.Contains(env, []byte(EnvMemoryUsed+"=")) {
			continue
		}
		vars := map[string]string{}
		for _, kv := range bytes.Split(env, []byte{0}) {
			if k, v, ok := strings.Cut(string(kv), "="); ok {
				vars[k] = v
			}
		}
		q, err := resource.ParseQuantity(vars[EnvMemoryUsed])
		if err != nil || q.Sign() < 0 {
			continue
		}
		sm, _ := strconv.ParseUint(vars[EnvSMUtil], 10, 32)
		for _, uuid := range strings.Split(vars["NVIDIA_VISIBLE_DEVICES"], ",") {
			if uuid = strings.TrimSpace(uuid); uuid != "" {
				out[uuid] = append(out[uuid], Process{PID: uint32(pid), UsedMemory: uint64(q.Value()), SMUtil: uint32(min(sm, 100))})
			}
		}
	}
	return out
}

// processFuncs serves the process queries of a GPU or MIG device handle.
func (s *Server) processFuncs(uuid string, running *func() ([]nvml.ProcessInfo, nvml.Return), util *func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return)) {
	*running = func() ([]nvml.ProcessInfo, nvml.Return) {
		procs := s.processes(uuid)
		out := make([]nvml.ProcessInfo, 0, len(procs))
		for _, p := range procs {
			out = append(out, nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: p.UsedMemory})
		}
		return out, nvml.SUCCESS
	}
	*util = func(lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		now := uint64(time.Now().UnixMicro())
		var out []nvml.ProcessUtilizationSample
		for _, p := range s.processes(uuid) {
			out = append(out, nvml.ProcessUtilizationSample{Pid: p.PID, TimeStamp: now, SmUtil: p.SMUtil})
		}
		if len(out) == 0 {
			// What NVML answers when no process ran since lastSeen.
			return nil, nvml.ERROR_NOT_FOUND
		}
		return out, nvml.SUCCESS
	}
}
