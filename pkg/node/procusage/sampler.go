// Package procusage measures what the compute processes on a node's GPUs use
// and which pod and container each runs in: one NVML pass over every GPU
// and MIG device (GetComputeRunningProcesses for memory,
// GetProcessUtilization for SM samples), each process mapped to its pod
// through /proc/<pid>/cgroup. Attributing processes to claims is the
// kubelet plugin's (it knows which pods each claim was prepared for).
package procusage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
)

// Process is a compute process on a GPU or MIG device.
type Process struct {
	PID uint32
	// Device is the UUID of the GPU or MIG device it runs on, GPU its
	// GPU's UUID.
	Device, GPU string
	// UsedMemory is the device memory it holds, in bytes (NVML).
	UsedMemory uint64
	// SMUtil is its SM utilization over the last interval, in percent of
	// the device (0 when NVML has no sample, e.g. on MIG devices).
	SMUtil int
	// Owner is its pod and container; Owned is false for processes
	// outside any pod or gone before they were looked up.
	Owner Owner
	Owned bool
}

// GPU is a GPU's memory as NVML reports it.
type GPU struct {
	UUID        string
	Index       int
	MemoryTotal uint64
	MemoryUsed  uint64
}

// Sample is the result of one pass.
type Sample struct {
	At        time.Time
	GPUs      []GPU
	Processes []Process
}

// Sampler takes samples; not safe for concurrent use (one loop owns it).
type Sampler struct {
	lib nvml.Interface
	// procRoot is the host's /proc: NVML reports host PIDs.
	procRoot string
	// lastSeen is the newest utilization sample per device, so that each
	// pass reads only newer ones.
	lastSeen map[string]uint64
	// owners are the owners of the PIDs of the last pass; seen those of
	// this pass. A PID listed by NVML in two passes in a row keeps the
	// owner read the first time (its process would have to end and a new
	// GPU process take its PID within one interval to be mistaken); one
	// that drops out is forgotten.
	owners, seen map[uint32]owner
}

type owner struct {
	o  Owner
	ok bool
}

// NewSampler samples through an initialised NVML; procRoot is where the
// host's /proc is mounted ("/proc" when the plugin shares the host's PID
// namespace or runs on the host).
func NewSampler(lib nvml.Interface, procRoot string) *Sampler {
	return &Sampler{lib: lib, procRoot: procRoot, lastSeen: map[string]uint64{}, owners: map[uint32]owner{}}
}

// Sample takes one pass over every GPU and MIG device. A device that
// fails a query is skipped (logged), not the pass.
func (s *Sampler) Sample(ctx context.Context) (*Sample, error) {
	logger := klog.FromContext(ctx)
	n, ret := s.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML device count: %s", nvml.ErrorString(ret))
	}
	out := &Sample{At: time.Now()}
	s.seen = make(map[uint32]owner, len(s.owners))
	defer func() { s.owners = s.seen }()
	for i := range n {
		dev, ret := s.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			logger.V(4).Info("Skipping a GPU in the usage sample", "index", i, "error", nvml.ErrorString(ret))
			continue
		}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			continue
		}
		g := GPU{UUID: uuid, Index: i}
		if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			g.MemoryTotal, g.MemoryUsed = mem.Total, mem.Used
		}
		out.GPUs = append(out.GPUs, g)
		if current, _, ret := dev.GetMigMode(); ret == nvml.SUCCESS && current == nvml.DEVICE_MIG_ENABLE {
			// In MIG mode processes are queried per MIG device: the
			// parent's list would count them again.
			max, _ := dev.GetMaxMigDeviceCount()
			for j := range max {
				md, ret := dev.GetMigDeviceHandleByIndex(j)
				if ret != nvml.SUCCESS {
					continue
				}
				if mu, ret := md.GetUUID(); ret == nvml.SUCCESS {
					out.Processes = s.device(ctx, out.Processes, md, mu, uuid)
				}
			}
			continue
		}
		out.Processes = s.device(ctx, out.Processes, dev, uuid, uuid)
	}
	return out, nil
}

func (s *Sampler) device(ctx context.Context, out []Process, dev nvml.Device, uuid, gpu string) []Process {
	procs, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		klog.FromContext(ctx).V(4).Info("No process list for a device", "device", uuid, "error", nvml.ErrorString(ret))
		return out
	}
	if len(procs) == 0 {
		return out
	}
	sm := map[uint32]int{}
	if samples, ret := dev.GetProcessUtilization(s.lastSeen[uuid]); ret == nvml.SUCCESS {
		for _, smp := range samples {
			sm[smp.Pid] = max(sm[smp.Pid], int(smp.SmUtil))
			s.lastSeen[uuid] = max(s.lastSeen[uuid], smp.TimeStamp)
		}
	}
	for _, p := range procs {
		pr := Process{PID: p.Pid, Device: uuid, GPU: gpu, UsedMemory: p.UsedGpuMemory, SMUtil: min(sm[p.Pid], 100)}
		ow, known := s.owners[p.Pid]
		if !known {
			if data, err := os.ReadFile(filepath.Join(s.procRoot, strconv.FormatUint(uint64(p.Pid), 10), "cgroup")); err == nil {
				ow.o, ow.ok = OwnerFromCgroup(string(data))
			}
		}
		s.seen[p.Pid] = ow
		pr.Owner, pr.Owned = ow.o, ow.ok
		out = append(out, pr)
	}
	return out
}
