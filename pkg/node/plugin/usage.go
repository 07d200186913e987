package plugin

import (
	"context"
	"sort"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/node/checkpoint"
	"github.com/tessera-dev/tessera/pkg/node/enforce"
	"github.com/tessera-dev/tessera/pkg/node/prepare"
	"github.com/tessera-dev/tessera/pkg/node/procusage"
)

// usageState is what the last sampling pass attributed to each claim, and
// what was last written into each claim's status.
type usageState struct {
	mu sync.Mutex
	// sample is the last pass; byClaim its usage per claim UID and device
	// name.
	sample  *procusage.Sample
	byClaim map[string]map[string]*v1alpha1.DeviceUsage
	// written is the usage last written to each claim's status.
	written map[string]map[string]v1alpha1.DeviceUsage
}

// runUsage samples every interval until ctx ends: one NVML pass for all
// GPUs, attributed to claims, exported as metrics and written into the
// claims' status when it changed noticeably.
func (d *Driver) runUsage(ctx context.Context, interval time.Duration) {
	sampler := procusage.NewSampler(d.backend, d.opts.HostProcRoot)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		d.sampleUsage(ctx, sampler)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (d *Driver) sampleUsage(ctx context.Context, sampler *procusage.Sampler) {
	start := time.Now()
	sample, err := sampler.Sample(ctx)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Sampling GPU usage failed")
		return
	}
	if d.metrics != nil {
		d.metrics.sampleDuration.Observe(time.Since(start).Seconds())
	}
	claims := d.preparer.Claims()
	byClaim := attribute(sample, claims)
	d.usage.mu.Lock()
	d.usage.sample, d.usage.byClaim = sample, byClaim
	if d.usage.written == nil {
		d.usage.written = map[string]map[string]v1alpha1.DeviceUsage{}
	}
	var changed []*checkpoint.Claim
	live := map[string]bool{}
	for _, c := range claims {
		live[c.UID] = true
		if usageChanged(d.usage.written[c.UID], byClaim[c.UID], c) {
			changed = append(changed, c)
			w := map[string]v1alpha1.DeviceUsage{}
			for dev, u := range byClaim[c.UID] {
				w[dev] = *u
			}
			d.usage.written[c.UID] = w
		}
	}
	for uid := range d.usage.written {
		if !live[uid] {
			delete(d.usage.written, uid)
		}
	}
	d.usage.mu.Unlock()
	for _, c := range changed {
		d.status.Set(ctx, types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, types.UID(c.UID), prepare.StatusDevices(devicemodel.DriverName, c, byClaim[c.UID]))
	}
}

// attribute sums each claim's processes per device: a process counts for
// a claim when it runs in one of the claim's pods on one of the claim's
// devices (GPU UUID for shares, whole GPUs and time slices; MIG UUID for
// MIG devices). Every device of every claim gets a usage, zero when no
// process runs there. When one pod holds several claims on the same
// device, its processes there count for the first of them (by UID).
func attribute(sample *procusage.Sample, claims []*checkpoint.Claim) map[string]map[string]*v1alpha1.DeviceUsage {
	at := metav1.NewTime(sample.At)
	out := map[string]map[string]*v1alpha1.DeviceUsage{}
	type target struct {
		claim  string
		device string
	}
	byPodDevice := map[[2]string]target{} // pod UID, device UUID
	for _, c := range claims {
		out[c.UID] = map[string]*v1alpha1.DeviceUsage{}
		for _, dev := range c.Devices {
			out[c.UID][dev.Device] = &v1alpha1.DeviceUsage{SampledAt: at}
			for _, p := range c.Pods {
				key := [2]string{p.UID, dev.UUID}
				if _, taken := byPodDevice[key]; !taken {
					byPodDevice[key] = target{claim: c.UID, device: dev.Device}
				}
			}
		}
	}
	for _, p := range sample.Processes {
		if !p.Owned {
			continue
		}
		t, ok := byPodDevice[[2]string{p.Owner.PodUID, p.Device}]
		if !ok {
			continue
		}
		u := out[t.claim][t.device]
		u.MemoryUsedBytes += p.UsedMemory
		u.SMUtilizationPercent = min(100, u.SMUtilizationPercent+p.SMUtil)
		u.Processes++
	}
	return out
}

// Thresholds of a usage change worth a status write: the API server is
// written only when a claim's usage moved noticeably, never just to
// refresh the sample time.
const (
	usageWriteMinBytes   = 64 << 20
	usageWriteFraction   = 20 // 1/20 = 5% of the claim's memory
	usageWriteSMPercents = 10
)

// usageChanged says whether a claim's usage differs enough from what its
// status says (written) to write it again: the first sample, a process
// count that changed, memory that moved by max(64 MiB, 5% of the
// device's allocation) or SM utilization by 10 points.
func usageChanged(written map[string]v1alpha1.DeviceUsage, now map[string]*v1alpha1.DeviceUsage, c *checkpoint.Claim) bool {
	if written == nil {
		return true
	}
	for _, dev := range c.Devices {
		w, ok := written[dev.Device]
		n := now[dev.Device]
		if !ok || n == nil {
			return true
		}
		step := max(uint64(usageWriteMinBytes), dev.Memory/usageWriteFraction)
		diff := int64(n.MemoryUsedBytes) - int64(w.MemoryUsedBytes)
		if n.Processes != w.Processes || diff >= int64(step) || -diff >= int64(step) ||
			n.SMUtilizationPercent-w.SMUtilizationPercent >= usageWriteSMPercents || w.SMUtilizationPercent-n.SMUtilizationPercent >= usageWriteSMPercents {
			return true
		}
	}
	return false
}

// claimUsage is one claim device's row of the metrics.
type claimUsage struct {
	namespace, claim, pod, device string
	allocated                     uint64
	compute                       int
	usage                         *v1alpha1.DeviceUsage
}

type gpuUsage struct {
	device, uuid                         string
	total, allocated, used, unattributed uint64
	healthy, sampled                     bool
	// processes counts the distinct compute processes (by PID) on the GPU
	// and its MIG devices at the last sample.
	processes int
}

type usageSnap struct {
	claims []claimUsage
	gpus   []gpuUsage
}

// usageSnapshot combines the prepared claims, the inventory, device health
// and the last sample for the metrics.
func (d *Driver) usageSnapshot() usageSnap {
	var snap usageSnap
	claims := d.preparer.Claims()
	d.usage.mu.Lock()
	sample, byClaim := d.usage.sample, d.usage.byClaim
	d.usage.mu.Unlock()
	allocated := map[string]uint64{}
	attributed := map[string]uint64{}
	for _, c := range claims {
		pod := ""
		if len(c.Pods) > 0 {
			pod = c.Pods[0].Name
		}
		for _, dev := range c.Devices {
			compute := dev.Cores
			if compute == 0 || dev.Enforced == string(enforce.Hard) {
				compute = 100
			}
			cu := claimUsage{namespace: c.Namespace, claim: c.Name, pod: pod, device: dev.Device, allocated: dev.Memory, compute: compute}
			if u := byClaim[c.UID][dev.Device]; u != nil {
				cu.usage = u
				attributed[dev.GPUUUID] += u.MemoryUsedBytes
			}
			allocated[dev.GPUUUID] += dev.Memory
			snap.claims = append(snap.claims, cu)
		}
	}
	inv := d.publisher.Inventory()
	if inv == nil {
		return snap
	}
	type measured struct{ used, procs uint64 }
	seen := map[string]measured{}
	pids := map[string]map[uint32]bool{} // GPU UUID -> PIDs
	if sample != nil {
		for _, g := range sample.GPUs {
			m := seen[g.UUID]
			m.used = g.MemoryUsed
			seen[g.UUID] = m
		}
		for _, p := range sample.Processes {
			m := seen[p.GPU]
			m.procs += p.UsedMemory
			seen[p.GPU] = m
			if pids[p.GPU] == nil {
				pids[p.GPU] = map[uint32]bool{}
			}
			pids[p.GPU][p.PID] = true
		}
	}
	for _, g := range inv.GPUs {
		name := devicemodel.GPUDeviceName(g.Index)
		healthy, _ := d.health.Health(inv, name)
		gu := gpuUsage{device: name, uuid: g.UUID, total: g.MemoryBytes, allocated: allocated[g.UUID], healthy: healthy}
		if m, ok := seen[g.UUID]; ok {
			gu.sampled = true
			gu.processes = len(pids[g.UUID])
			// NVML's used memory includes the driver's own; a mock or a
			// driver that reports none gets the processes' sum.
			gu.used = max(m.used, m.procs)
			if m.procs > attributed[g.UUID] {
				gu.unattributed = m.procs - attributed[g.UUID]
			}
		}
		snap.gpus = append(snap.gpus, gu)
	}
	sort.Slice(snap.gpus, func(i, j int) bool { return snap.gpus[i].device < snap.gpus[j].device })
	return snap
}
