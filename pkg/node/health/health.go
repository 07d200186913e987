// Package health watches NVML for GPU faults and says which published
// devices are unhealthy and why: for the kubelet's health stream
// (WatchHealthStatus) and as device taints in the published
// ResourceSlices, one key per cause (classes.go).
//
// XIDs caused by applications rather than the GPU (the list the NVIDIA
// device plugin skips: 13, 31, 43, 45, 68, 109) give an informational
// taint (effect None); any other XID, a double-bit ECC event or a GPU
// NVML calls lost makes the GPU unhealthy, or only the MIG device when
// NVML attributes the error to a GPU instance, with the fatal effect
// (NoSchedule unless configured NoExecute).
//
// Recovery: every probe interval the monitor asks NVML about each GPU. A
// taint is cleared once the GPU answers and no new event of its cause
// came for the hold-down period; a GPU that does not answer keeps its
// taints and restarts the hold-down. A hold-down of 0 keeps taints until
// the plugin restarts.
package health

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/discover"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
)

// DefaultIgnoredXIDs are application errors that do not make a GPU
// unhealthy (they give an informational taint).
var DefaultIgnoredXIDs = []uint64{13, 31, 43, 45, 68, 109}

// Defaults of Options.
const (
	DefaultHoldDown      = 5 * time.Minute
	DefaultProbeInterval = 5 * time.Second
)

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

// Options configure a Monitor.
type Options struct {
	// IgnoredXIDs are application XIDs: informational, effect None.
	IgnoredXIDs []uint64
	// FatalEffect is the effect of the taints of fatal events:
	// NoSchedule (default) or NoExecute.
	FatalEffect resourceapi.DeviceTaintEffect
	// HoldDown is how long a GPU must answer NVML with no new event of a
	// cause before that cause's taint is cleared; 0 never clears.
	HoldDown time.Duration
	// ProbeInterval is how often NVML is asked about each GPU; 0 means
	// DefaultProbeInterval.
	ProbeInterval time.Duration
	// OnChange runs (without locks held) whenever the taints or health
	// change, e.g. to republish slices.
	OnChange func()
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time
}

// fault is one cause on one GPU or MIG device.
type fault struct {
	key   string
	value string
	fatal bool
	first time.Time // TimeAdded: when this episode began
	last  time.Time // last event, or last probe the GPU did not answer
}

func (f fault) message() string {
	return fmt.Sprintf("%s=%s since %s", f.key, f.value, f.first.UTC().Format(time.RFC3339))
}

type migKey struct {
	gpu   string
	start int
	token string
}

// gpuScope is the key of faults of a whole GPU.
func gpuScope(uuid string) migKey { return migKey{gpu: uuid, start: -1} }

// Monitor tracks device health.
type Monitor struct {
	lib     nvml.Interface
	pool    string
	ignored map[uint64]bool
	opts    Options

	mu      sync.Mutex
	faults  map[migKey]map[string]*fault // scope -> key -> fault
	changed chan struct{}
}

// New returns a monitor.
func New(lib nvml.Interface, pool string, opts Options) *Monitor {
	if opts.FatalEffect == "" {
		opts.FatalEffect = resourceapi.DeviceTaintEffectNoSchedule
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = DefaultProbeInterval
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m := &Monitor{lib: lib, pool: pool, ignored: map[uint64]bool{}, opts: opts,
		faults: map[migKey]map[string]*fault{}, changed: make(chan struct{})}
	for _, x := range opts.IgnoredXIDs {
		m.ignored[x] = true
	}
	return m
}

// Run listens for NVML events on the given GPUs and probes them until ctx
// ends.
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
			logger.Info("GPU does not report supported events; not watching its events", "gpu", gpu.UUID, "error", nvml.ErrorString(ret))
			continue
		}
		want := supported & (nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)
		if ret := dev.RegisterEvents(want, es); ret != nvml.SUCCESS {
			logger.Info("Cannot register for GPU events; not watching its events", "gpu", gpu.UUID, "error", nvml.ErrorString(ret))
		}
	}
	nextProbe := m.opts.Now().Add(m.opts.ProbeInterval)
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
		if now := m.opts.Now(); !now.Before(nextProbe) {
			m.Probe(ctx, inv)
			nextProbe = now.Add(m.opts.ProbeInterval)
		}
	}
	return nil
}

// record adds or refreshes a fault and reports whether the taints changed.
func (m *Monitor) record(scope migKey, key, value string, fatal bool, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	byKey := m.faults[scope]
	if byKey == nil {
		byKey = map[string]*fault{}
		m.faults[scope] = byKey
	}
	f := byKey[key]
	if f != nil && f.value == value {
		f.last = now
		return false
	}
	if f == nil {
		f = &fault{key: key, fatal: fatal, first: now.Truncate(time.Second)}
		byKey[key] = f
	}
	f.value, f.last = value, now
	m.signalLocked()
	return true
}

func (m *Monitor) signalLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *Monitor) notify() {
	if m.opts.OnChange != nil {
		m.opts.OnChange()
	}
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
		xid = xidDBE
	}
	key, fatal := Classify(xid, m.ignored)
	scope, isMIG := m.migKey(ev, uuid)
	if !isMIG {
		scope = gpuScope(uuid)
	}
	changed := m.record(scope, key, ValueXID(xid), fatal, m.opts.Now())
	logger.Info("GPU event", "gpu", uuid, "xid", xid, "taint", key, "fatal", fatal, "mig", isMIG, "placement", scope.start, "profile", scope.token)
	if changed {
		m.notify()
	}
}

// Probe asks NVML about every GPU: one that does not answer gets (or
// keeps) KeyGPULost and restarts its hold-down; on one that answers,
// faults older than the hold-down are cleared.
func (m *Monitor) Probe(ctx context.Context, inv *inventory.Inventory) {
	logger := klog.FromContext(ctx)
	now := m.opts.Now()
	changed := false
	for _, gpu := range inv.GPUs {
		if ok, why := m.answers(gpu.UUID); !ok {
			logger.Info("GPU does not answer NVML", "gpu", gpu.UUID, "error", why)
			m.mu.Lock()
			for scope, byKey := range m.faults {
				if scope.gpu == gpu.UUID {
					for _, f := range byKey {
						f.last = now
					}
				}
			}
			lost := m.faults[gpuScope(gpu.UUID)][KeyGPULost] != nil
			m.mu.Unlock()
			if !lost {
				changed = m.record(gpuScope(gpu.UUID), KeyGPULost, ValueLost, true, now) || changed
			}
			continue
		}
		if m.opts.HoldDown <= 0 {
			continue
		}
		m.mu.Lock()
		for scope, byKey := range m.faults {
			if scope.gpu != gpu.UUID {
				continue
			}
			for key, f := range byKey {
				if now.Sub(f.last) >= m.opts.HoldDown {
					logger.Info("GPU recovered from a fault", "gpu", gpu.UUID, "taint", key, "value", f.value, "since", f.first, "placement", scope.start, "profile", scope.token)
					delete(byKey, key)
					changed = true
				}
			}
			if len(byKey) == 0 {
				delete(m.faults, scope)
			}
		}
		if changed {
			m.signalLocked()
		}
		m.mu.Unlock()
	}
	if changed {
		m.notify()
	}
}

// answers says whether NVML answers about the GPU: a lost GPU fails its
// queries with ERROR_GPU_IS_LOST. The probe is the performance state, a
// cheap query every supported GPU answers.
func (m *Monitor) answers(uuid string) (bool, string) {
	dev, ret := m.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return false, nvml.ErrorString(ret)
	}
	if _, ret := dev.GetPerformanceState(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
		return false, nvml.ErrorString(ret)
	}
	return true, ""
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

// faultsOf returns the faults that apply to a device, by key: the GPU's
// and, for a MIG device, its own (the GPU's win on the same key).
func (m *Monitor) faultsOf(inv *inventory.Inventory, device string) map[string]fault {
	name, err := devicemodel.ParseName(device)
	if err != nil || inv == nil || name.Index >= len(inv.GPUs) {
		return nil
	}
	uuid := inv.GPUs[name.Index].UUID
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]fault{}
	if name.Type == devicemodel.TypeMIG {
		for k, f := range m.faults[migKey{gpu: uuid, start: name.Start, token: name.ProfileToken}] {
			out[k] = *f
		}
	}
	for k, f := range m.faults[gpuScope(uuid)] {
		out[k] = *f
	}
	return out
}

// Health returns a device's health and, when unhealthy, why.
func (m *Monitor) Health(inv *inventory.Inventory, device string) (bool, string) {
	var why []string
	for _, f := range m.faultsOf(inv, device) {
		if f.fatal {
			why = append(why, f.message())
		}
	}
	if len(why) == 0 {
		return true, ""
	}
	sort.Strings(why)
	return false, strings.Join(why, "; ")
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

// Taints returns the taints of every device among the names that has a
// fault: one per cause, the value naming the event, TimeAdded when the
// fault began (to the second, as the API server keeps it).
func (m *Monitor) Taints(inv *inventory.Inventory, names []string) map[string][]resourceapi.DeviceTaint {
	out := map[string][]resourceapi.DeviceTaint{}
	m.mu.Lock()
	faults := len(m.faults)
	m.mu.Unlock()
	if faults == 0 {
		return out
	}
	for _, n := range names {
		fs := m.faultsOf(inv, n)
		if len(fs) == 0 {
			continue
		}
		taints := make([]resourceapi.DeviceTaint, 0, len(fs))
		for _, f := range fs {
			effect := resourceapi.DeviceTaintEffectNone
			if f.fatal {
				effect = m.opts.FatalEffect
			}
			taints = append(taints, resourceapi.DeviceTaint{Key: f.key, Value: f.value, Effect: effect, TimeAdded: &metav1.Time{Time: f.first}})
		}
		sort.Slice(taints, func(i, j int) bool { return taints[i].Key < taints[j].Key })
		out[n] = taints
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
