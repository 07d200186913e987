// Package health watches NVML events for critical XID errors and says
// which published devices are unhealthy: for the kubelet's health stream
// (WatchHealthStatus) and as NoSchedule device taints in the published
// ResourceSlices.
//
// XIDs caused by applications rather than the GPU (the list the NVIDIA
// device plugin skips: 13, 31, 43, 45, 68, 109) are ignored; any other
// XID marks the GPU unhealthy, or only the MIG device when NVML attributes
// the error to a GPU instance. A device stays unhealthy until the plugin
// restarts (most critical XIDs need a GPU reset).
package health

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/devicemodel"
	"github.com/tessera-dev/tessera/pkg/discover"
	"github.com/tessera-dev/tessera/pkg/inventory"
)

// DefaultIgnoredXIDs are application errors that do not make a GPU
// unhealthy.
var DefaultIgnoredXIDs = []uint64{13, 31, 43, 45, 68, 109}

// TaintKey is the key of the taint unhealthy devices get.
const TaintKey = devicemodel.DriverName + "/unhealthy"

// Timing of the health stream.
const (
	// ReportInterval re-sends the full report so the kubelet's view never
	// goes stale.
	ReportInterval = 10 * time.Second
	// HealthCheckTimeout tells the kubelet when to consider a device's
	// health unknown.
	HealthCheckTimeout = 30 * time.Second
	waitTimeoutMs      = 200
	noInstance         = 0xFFFFFFFF
)

type fault struct {
	xid  uint64
	when time.Time
}

func (f fault) message() string {
	return fmt.Sprintf("critical XID %d at %s", f.xid, f.when.UTC().Format(time.RFC3339))
}

type migKey struct {
	gpu   string
	start int
	token string
}

// Monitor tracks device health.
type Monitor struct {
	lib      nvml.Interface
	pool     string
	ignored  map[uint64]bool
	onChange func()

	mu      sync.Mutex
	gpus    map[string]fault // by GPU UUID
	migs    map[migKey]fault
	changed chan struct{}
}

// New returns a monitor; onChange runs (without locks held) whenever a
// device turns unhealthy, e.g. to republish slices.
func New(lib nvml.Interface, pool string, ignoredXIDs []uint64, onChange func()) *Monitor {
	m := &Monitor{lib: lib, pool: pool, ignored: map[uint64]bool{}, onChange: onChange,
		gpus: map[string]fault{}, migs: map[migKey]fault{}, changed: make(chan struct{})}
	for _, x := range ignoredXIDs {
		m.ignored[x] = true
	}
	return m
}

// Run listens for NVML events on the given GPUs until ctx ends.
func (m *Monitor) Run(ctx context.Context, inv *inventory.Inventory) error {
	logger := klog.FromContext(ctx)
	es, ret := m.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("create NVML event set: %s", nvml.ErrorString(ret))
	}
	defer func() {
		if ret := es.Free(); ret != nvml.SUCCESS {
			logger.V(2).Info("Freeing the NVML event set failed", "error", nvml.ErrorString(ret))
		}
	}()
	for _, gpu := range inv.GPUs {
		dev, ret := m.lib.DeviceGetHandleByUUID(gpu.UUID)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("get GPU %s: %s", gpu.UUID, nvml.ErrorString(ret))
		}
		supported, ret := dev.GetSupportedEventTypes()
		if ret != nvml.SUCCESS {
			logger.Info("GPU does not report supported events; not watching its health", "gpu", gpu.UUID, "error", nvml.ErrorString(ret))
			continue
		}
		want := supported & (nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)
		if ret := dev.RegisterEvents(want, es); ret != nvml.SUCCESS {
			logger.Info("Cannot register for GPU events; not watching its health", "gpu", gpu.UUID, "error", nvml.ErrorString(ret))
		}
	}
	for ctx.Err() == nil {
		ev, ret := es.Wait(waitTimeoutMs)
		switch ret {
		case nvml.SUCCESS:
			m.handle(ctx, ev)
		case nvml.ERROR_TIMEOUT:
		default:
			logger.Error(fmt.Errorf("%s", nvml.ErrorString(ret)), "Waiting for GPU events failed")
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

func (m *Monitor) handle(ctx context.Context, ev nvml.EventData) {
	logger := klog.FromContext(ctx)
	if ev.Device == nil {
		return
	}
	uuid, ret := ev.Device.GetUUID()
	if ret != nvml.SUCCESS {
		return
	}
	xid := ev.EventData
	if ev.EventType == nvml.EventTypeDoubleBitEccError {
		xid = 48 // double-bit ECC error
	}
	if m.ignored[xid] {
		logger.V(2).Info("Ignoring application XID", "gpu", uuid, "xid", xid)
		return
	}
	f := fault{xid: xid, when: time.Now()}
	key, isMIG := m.migKey(ev, uuid)
	m.mu.Lock()
	if isMIG {
		m.migs[key] = f
	} else {
		m.gpus[uuid] = f
	}
	close(m.changed)
	m.changed = make(chan struct{})
	m.mu.Unlock()
	if isMIG {
		logger.Info("MIG device unhealthy", "gpu", uuid, "placement", key.start, "profile", key.token, "xid", xid)
	} else {
		logger.Info("GPU unhealthy", "gpu", uuid, "xid", xid)
	}
	if m.onChange != nil {
		m.onChange()
	}
}

// migKey attributes an event to a MIG device when NVML names a GPU
// instance.
func (m *Monitor) migKey(ev nvml.EventData, uuid string) (migKey, bool) {
	if ev.GpuInstanceId == noInstance {
		return migKey{}, false
	}
	gi, ret := ev.Device.GetGpuInstanceById(int(ev.GpuInstanceId))
	if ret != nvml.SUCCESS {
		return migKey{}, false
	}
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return migKey{}, false
	}
	pinfo, ret := ev.Device.GetGpuInstanceProfileInfo(int(info.ProfileId))
	if ret != nvml.SUCCESS {
		return migKey{}, false
	}
	mem, _ := ev.Device.GetMemoryInfo()
	name := discover.ProfileName(int(info.ProfileId), int(pinfo.SliceCount), pinfo.MemorySizeMB, mem.Total)
	return migKey{gpu: uuid, start: int(info.Placement.Start), token: devicemodel.ProfileToken(name)}, true
}

// Health returns a device's health and, when unhealthy, why.
func (m *Monitor) Health(inv *inventory.Inventory, device string) (bool, string) {
	name, err := devicemodel.ParseName(device)
	if err != nil || inv == nil || name.Index >= len(inv.GPUs) {
		return true, ""
	}
	uuid := inv.GPUs[name.Index].UUID
	m.mu.Lock()
	defer m.mu.Unlock()
	if f, ok := m.gpus[uuid]; ok {
		return false, "GPU " + f.message()
	}
	if name.Type == devicemodel.TypeMIG {
		if f, ok := m.migs[migKey{gpu: uuid, start: name.Start, token: name.ProfileToken}]; ok {
			return false, "MIG device " + f.message()
		}
	}
	return true, ""
}

// Unhealthy returns the unhealthy devices among names with the reason.
func (m *Monitor) Unhealthy(inv *inventory.Inventory, names []string) map[string]string {
	out := map[string]string{}
	for _, n := range names {
		if ok, why := m.Health(inv, n); !ok {
			out[n] = why
		}
	}
	return out
}

// Taints returns the NoSchedule taint of every unhealthy device among the
// names.
func (m *Monitor) Taints(inv *inventory.Inventory, names []string) map[string][]resourceapi.DeviceTaint {
	out := map[string][]resourceapi.DeviceTaint{}
	m.mu.Lock()
	faults := len(m.gpus) + len(m.migs)
	m.mu.Unlock()
	if faults == 0 {
		return out
	}
	for n := range m.Unhealthy(inv, names) {
		name, _ := devicemodel.ParseName(n)
		uuid := inv.GPUs[name.Index].UUID
		m.mu.Lock()
		f, ok := m.gpus[uuid]
		if !ok {
			f = m.migs[migKey{gpu: uuid, start: name.Start, token: name.ProfileToken}]
		}
		m.mu.Unlock()
		out[n] = []resourceapi.DeviceTaint{{Key: TaintKey, Value: fmt.Sprintf("XID%d", f.xid), Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	}
	return out
}

// Watch implements kubeletplugin.DRAPlugin.WatchHealthStatus: a full
// report now, on every change and every ReportInterval. devices returns
// the inventory and the names of the published devices.
func (m *Monitor) Watch(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport, devices func() (*inventory.Inventory, []string)) error {
	ticker := time.NewTicker(ReportInterval)
	defer ticker.Stop()
	for {
		m.mu.Lock()
		changed := m.changed
		m.mu.Unlock()
		inv, names := devices()
		report := kubeletplugin.DeviceHealthReport{}
		now := time.Now()
		sort.Strings(names)
		for _, n := range names {
			ok, why := m.Health(inv, n)
			h := kubeletplugin.DeviceHealth{PoolName: m.pool, DeviceName: n, Health: kubeletplugin.HealthStatusHealthy,
				LastUpdated: now, HealthCheckTimeout: HealthCheckTimeout}
			if !ok {
				h.Health, h.Message = kubeletplugin.HealthStatusUnhealthy, why
			}
			report.Devices = append(report.Devices, h)
		}
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-ticker.C:
		}
	}
}
