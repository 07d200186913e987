// Package nvmlmock serves nvml.Interface for GPUs that are not there.
//
// It is built on go-nvml's own generated mocks (pkg/nvml/mock) and adds what
// a kubelet plugin needs to be exercised end to end on a machine without
// GPUs: several card models (T4, A10, L4, A100, H100, H200, B200) in any mix,
// stable UUIDs derived from the node name, MIG with NVML's placement rules
// (overlapping or unsupported placements are rejected as NVML rejects them),
// MIG devices with their own UUIDs, optional persistence of MIG state across
// process restarts (as a real GPU keeps its instances when the plugin dies),
// and injectable XID events for health tests.
package nvmlmock

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/google/uuid"

	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
)

// Options configure a mock server.
type Options struct {
	Spec NodeSpec
	// Seed makes UUIDs stable; use the node name.
	Seed string
	// MIGEnabled puts every MIG-capable GPU into MIG mode (no instances).
	MIGEnabled bool
	// StatePath, when set, persists MIG mode and instances there (atomically)
	// and restores them on start.
	StatePath     string
	DriverVersion string
	// CUDADriverVersion as NVML encodes it (12040 = 12.4).
	CUDADriverVersion int
	// ProcRoot, when set, is a /proc whose processes that set
	// EnvMemoryUsed are reported as compute processes on the devices in
	// their NVIDIA_VISIBLE_DEVICES (see SetProcesses for tests).
	ProcRoot string
}

// Server is a mock NVML library.
type Server struct {
	mock.Interface
	opts    Options
	mu      sync.Mutex
	devices []*Device
	events  chan nvml.EventData
	procs   map[string][]Process

	scanMu sync.Mutex
	scan   map[string][]Process
	scanAt time.Time
}

var _ nvml.Interface = (*Server)(nil)

// Device is one mock GPU.
type Device struct {
	mock.Device
	srv     *Server
	Index   int
	ModelID string
	Model   Model
	UUID    string
	migMode int
	lost    atomic.Bool
	gis     map[uint32]*GpuInstance
	nextGI  uint32
}

// GpuInstance is one MIG GPU instance.
type GpuInstance struct {
	mock.GpuInstance
	dev       *Device
	id        uint32
	profile   MIGProfile
	placement nvml.GpuInstancePlacement
	cis       map[uint32]*ComputeInstance
	nextCI    uint32
}

// ComputeInstance is one MIG compute instance; it is also reachable as a
// MIG device handle.
type ComputeInstance struct {
	mock.ComputeInstance
	gi        *GpuInstance
	id        uint32
	profileID uint32
	migDevice *MigDevice
}

// MigDevice is the device handle of a MIG device.
type MigDevice struct {
	mock.Device
	ci   *ComputeInstance
	UUID string
}

// DefaultDriverVersion is the driver version mock GPUs report unless
// Options.DriverVersion says otherwise; the fixture driver root
// (pkg/node/driverfiles/fixture) is built for it.
const DefaultDriverVersion = "580.95.05"

// New builds a mock server.
func New(opts Options) (*Server, error) {
	if err := opts.Spec.Validate(); err != nil {
		return nil, err
	}
	if opts.DriverVersion == "" {
		opts.DriverVersion = DefaultDriverVersion
	}
	if opts.CUDADriverVersion == 0 {
		opts.CUDADriverVersion = 13000
	}
	s := &Server{opts: opts, events: make(chan nvml.EventData, 64)}
	for i, id := range opts.Spec.Models() {
		m := Models[id]
		d := &Device{
			srv:     s,
			Index:   i,
			ModelID: id,
			Model:   m,
			UUID:    "GPU-" + uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "tessera/%s/%d/%s", opts.Seed, i, id)).String(),
			gis:     map[uint32]*GpuInstance{},
		}
		if opts.MIGEnabled && len(m.MIG) > 0 {
			d.migMode = nvml.DEVICE_MIG_ENABLE
		}
		d.setFuncs()
		s.devices = append(s.devices, d)
	}
	if opts.StatePath != "" {
		if err := s.load(); err != nil {
			return nil, err
		}
	}
	s.setFuncs()
	return s, nil
}

// Devices returns the mock GPUs in index order.
func (s *Server) Devices() []*Device { return s.devices }

// InjectXID queues an XID error event for the GPU with the given UUID, as
// the driver reports it through an event set.
func (s *Server) InjectXID(gpuUUID string, xid uint64) error {
	for _, d := range s.devices {
		if d.UUID == gpuUUID {
			if xid == xidFallenOffBus {
				d.lost.Store(true)
			}
			s.events <- nvml.EventData{Device: d, EventType: nvml.EventTypeXidCriticalError, EventData: xid, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
			return nil
		}
	}
	return fmt.Errorf("no mock GPU with UUID %q", gpuUUID)
}

func (s *Server) setFuncs() {
	s.InitFunc = func() nvml.Return { return nvml.SUCCESS }
	s.ShutdownFunc = func() nvml.Return { return nvml.SUCCESS }
	s.ErrorStringFunc = func(r nvml.Return) string { return nvml.ErrorString(r) }
	s.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return s.opts.DriverVersion, nvml.SUCCESS }
	s.SystemGetCudaDriverVersionFunc = func() (int, nvml.Return) { return s.opts.CUDADriverVersion, nvml.SUCCESS }
	s.DeviceGetCountFunc = func() (int, nvml.Return) { return len(s.devices), nvml.SUCCESS }
	s.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i < 0 || i >= len(s.devices) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return s.devices[i], nvml.SUCCESS
	}
	s.DeviceGetHandleByUUIDFunc = func(u string) (nvml.Device, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, d := range s.devices {
			if d.UUID == u {
				return d, nvml.SUCCESS
			}
			for _, gi := range d.gis {
				for _, ci := range gi.cis {
					if ci.migDevice.UUID == u {
						return ci.migDevice, nvml.SUCCESS
					}
				}
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		es := &mock.EventSet{}
		es.WaitFunc = func(timeoutMs uint32) (nvml.EventData, nvml.Return) {
			select {
			case ev := <-s.events:
				return ev, nvml.SUCCESS
			case <-time.After(time.Duration(timeoutMs) * time.Millisecond):
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		}
		es.FreeFunc = func() nvml.Return { return nvml.SUCCESS }
		return es, nvml.SUCCESS
	}
}

func (d *Device) setFuncs() {
	m := d.Model
	d.GetIndexFunc = func() (int, nvml.Return) { return d.Index, nvml.SUCCESS }
	d.GetMinorNumberFunc = func() (int, nvml.Return) { return d.Index, nvml.SUCCESS }
	d.GetUUIDFunc = func() (string, nvml.Return) { return d.UUID, nvml.SUCCESS }
	d.GetNameFunc = func() (string, nvml.Return) { return m.Name, nvml.SUCCESS }
	d.GetBrandFunc = func() (nvml.BrandType, nvml.Return) { return m.Brand, nvml.SUCCESS }
	d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return m.Architecture, nvml.SUCCESS }
	d.GetCudaComputeCapabilityFunc = func() (int, int, nvml.Return) { return m.CCMajor, m.CCMinor, nvml.SUCCESS }
	// The health monitor's probe: a lost GPU fails it.
	d.GetPerformanceStateFunc = func() (nvml.Pstates, nvml.Return) {
		if d.Lost() {
			return nvml.PSTATE_UNKNOWN, nvml.ERROR_GPU_IS_LOST
		}
		return nvml.PSTATE_0, nvml.SUCCESS
	}
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		total := m.MemoryMiB << 20
		return nvml.Memory{Total: total, Free: total}, nvml.SUCCESS
	}
	// As the real driver does for a whole GPU (seen on an H200, driver
	// 580.159.04): SUCCESS with no SM count; the count comes from the
	// CUDA cores.
	d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		return nvml.DeviceAttributes{MemorySizeMB: m.MemoryMiB}, nvml.SUCCESS
	}
	d.GetNumGpuCoresFunc = func() (int, nvml.Return) {
		return int(m.Multiprocessors) * inventory.CoresPerSM(m.CCMajor, m.CCMinor), nvml.SUCCESS
	}
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		p := nvml.PciInfo{Domain: 0, Bus: pciBus(d.Index), PciDeviceId: m.PciDeviceID}
		copy8(p.BusId[:], fmt.Sprintf("00000000:%02X:00.0", p.Bus))
		return p, nvml.SUCCESS
	}
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return nvml.EventTypeXidCriticalError, nvml.SUCCESS }
	d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		if len(m.MIG) == 0 {
			return 0, 0, nvml.ERROR_NOT_SUPPORTED
		}
		d.srv.mu.Lock()
		defer d.srv.mu.Unlock()
		return d.migMode, d.migMode, nvml.SUCCESS
	}
	d.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) {
		if len(m.MIG) == 0 {
			return nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_SUPPORTED
		}
		d.srv.mu.Lock()
		defer d.srv.mu.Unlock()
		if mode == nvml.DEVICE_MIG_DISABLE && len(d.gis) > 0 {
			return nvml.ERROR_IN_USE, nvml.ERROR_IN_USE
		}
		d.migMode = mode
		return nvml.SUCCESS, d.srv.saveLocked()
	}
	d.GetGpuInstanceProfileInfoFunc = func(id int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		p, ok := d.profile(uint32(id))
		if !ok {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return p.Info, nvml.SUCCESS
	}
	d.GetGpuInstancePossiblePlacementsFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
		p, ok := d.profile(info.Id)
		if !ok {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		return append([]nvml.GpuInstancePlacement(nil), p.Placements...), nvml.SUCCESS
	}
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		d.srv.mu.Lock()
		defer d.srv.mu.Unlock()
		gi, ret := d.createGILocked(info.Id, *pl)
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		return gi, d.srv.saveLocked()
	}
	d.GetGpuInstancesFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
		d.srv.mu.Lock()
		defer d.srv.mu.Unlock()
		var out []nvml.GpuInstance
		for _, gi := range d.sortedGIs() {
			if gi.profile.Info.Id == info.Id {
				out = append(out, gi)
			}
		}
		return out, nvml.SUCCESS
	}
	d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		d.srv.mu.Lock()
		defer d.srv.mu.Unlock()
		gi, ok := d.gis[uint32(id)]
		if !ok {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return gi, nvml.SUCCESS
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) {
		if len(m.MIG) == 0 {
			return 0, nvml.SUCCESS
		}
		return 7, nvml.SUCCESS
	}
	d.srv.processFuncs(d.UUID, &d.GetComputeRunningProcessesFunc, &d.GetProcessUtilizationFunc)
	d.GetMigDeviceHandleByIndexFunc = func(n int) (nvml.Device, nvml.Return) {
		d.srv.mu.Lock()
		defer d.srv.mu.Unlock()
		var all []*MigDevice
		for _, gi := range d.sortedGIs() {
			for _, ci := range gi.sortedCIs() {
				all = append(all, ci.migDevice)
			}
		}
		if n < 0 || n >= len(all) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return all[n], nvml.SUCCESS
	}
}

func (d *Device) profile(id uint32) (MIGProfile, bool) {
	for _, p := range d.Model.MIG {
		if p.Info.Id == id {
			return p, true
		}
	}
	return MIGProfile{}, false
}

// createGILocked applies NVML's rules: MIG mode on, a known profile, one of
// its placements, no overlap with an existing instance (memory slices), the
// profile's instance count, and the GPU's compute slices and engines (the
// full-GPU profile's: copy engines, decoders, JPEG and OFA units, which
// media-extension profiles such as 1g.10gb+me use).
func (d *Device) createGILocked(profileID uint32, pl nvml.GpuInstancePlacement) (*GpuInstance, nvml.Return) {
	if d.migMode != nvml.DEVICE_MIG_ENABLE {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	p, ok := d.profile(profileID)
	if !ok {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	valid := false
	for _, c := range p.Placements {
		if c == pl {
			valid = true
		}
	}
	if !valid {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	same := 0
	for _, gi := range d.gis {
		if gi.placement.Start < pl.Start+pl.Size && pl.Start < gi.placement.Start+gi.placement.Size {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		if gi.profile.Info.Id == profileID {
			same++
		}
	}
	if uint32(same) >= p.Info.InstanceCount {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	if !d.fitsLocked(p.Info) {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	gi := &GpuInstance{dev: d, id: d.nextGI, profile: p, placement: pl, cis: map[uint32]*ComputeInstance{}}
	d.nextGI++
	d.gis[gi.id] = gi
	gi.setFuncs()
	return gi, nvml.SUCCESS
}

// fitsLocked says whether the GPU's compute slices and engines, less those
// of the existing GPU instances, hold one more instance of info's profile.
func (d *Device) fitsLocked(info nvml.GpuInstanceProfileInfo) bool {
	var total nvml.GpuInstanceProfileInfo
	for _, p := range d.Model.MIG {
		if p.Info.SliceCount > total.SliceCount {
			total = p.Info
		}
	}
	used := info
	for _, gi := range d.gis {
		u := gi.profile.Info
		used.SliceCount += u.SliceCount
		used.CopyEngineCount += u.CopyEngineCount
		used.DecoderCount += u.DecoderCount
		used.JpegCount += u.JpegCount
		used.OfaCount += u.OfaCount
	}
	return used.SliceCount <= total.SliceCount && used.CopyEngineCount <= total.CopyEngineCount &&
		used.DecoderCount <= total.DecoderCount && used.JpegCount <= total.JpegCount && used.OfaCount <= total.OfaCount
}

func (d *Device) sortedGIs() []*GpuInstance {
	out := make([]*GpuInstance, 0, len(d.gis))
	for _, gi := range d.gis {
		out = append(out, gi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

func (gi *GpuInstance) sortedCIs() []*ComputeInstance {
	out := make([]*ComputeInstance, 0, len(gi.cis))
	for _, ci := range gi.cis {
		out = append(out, ci)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// ciProfileForSlices maps a compute instance's slice count to NVML's
// compute instance profile constant.
var ciProfileForSlices = map[uint32]uint32{
	1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE,
	2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
	4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	6: nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE,
	7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
	8: nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE,
}

func (gi *GpuInstance) ciProfile(id int) (nvml.ComputeInstanceProfileInfo, bool) {
	for slices, ciID := range ciProfileForSlices {
		if int(ciID) == id && slices <= gi.profile.Info.SliceCount {
			return nvml.ComputeInstanceProfileInfo{
				Id:                  ciID,
				SliceCount:          slices,
				InstanceCount:       gi.profile.Info.SliceCount / slices,
				MultiprocessorCount: gi.profile.Info.MultiprocessorCount * slices / gi.profile.Info.SliceCount,
			}, true
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, false
}

func (gi *GpuInstance) setFuncs() {
	gi.GetInfoFunc = func() (nvml.GpuInstanceInfo, nvml.Return) {
		return nvml.GpuInstanceInfo{Device: gi.dev, Id: gi.id, ProfileId: gi.profile.Info.Id, Placement: gi.placement}, nvml.SUCCESS
	}
	gi.GetComputeInstanceProfileInfoFunc = func(id, eng int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
		if eng != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		info, ok := gi.ciProfile(id)
		if !ok {
			return info, nvml.ERROR_NOT_SUPPORTED
		}
		return info, nvml.SUCCESS
	}
	gi.CreateComputeInstanceFunc = func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		s := gi.dev.srv
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := gi.dev.gis[gi.id]; !ok {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		used := uint32(0)
		for _, ci := range gi.cis {
			p, _ := gi.ciProfile(int(ci.profileID))
			used += p.SliceCount
		}
		if used+info.SliceCount > gi.profile.Info.SliceCount {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		ci := gi.addCILocked(gi.nextCI, info.Id)
		return ci, s.saveLocked()
	}
	gi.GetComputeInstancesFunc = func(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
		gi.dev.srv.mu.Lock()
		defer gi.dev.srv.mu.Unlock()
		var out []nvml.ComputeInstance
		for _, ci := range gi.sortedCIs() {
			if ci.profileID == info.Id {
				out = append(out, ci)
			}
		}
		return out, nvml.SUCCESS
	}
	gi.GetComputeInstanceByIdFunc = func(id int) (nvml.ComputeInstance, nvml.Return) {
		gi.dev.srv.mu.Lock()
		defer gi.dev.srv.mu.Unlock()
		ci, ok := gi.cis[uint32(id)]
		if !ok {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return ci, nvml.SUCCESS
	}
	gi.DestroyFunc = func() nvml.Return {
		s := gi.dev.srv
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := gi.dev.gis[gi.id]; !ok {
			return nvml.ERROR_NOT_FOUND
		}
		if len(gi.cis) > 0 {
			return nvml.ERROR_IN_USE
		}
		delete(gi.dev.gis, gi.id)
		return s.saveLocked()
	}
}

func (gi *GpuInstance) addCILocked(id, profileID uint32) *ComputeInstance {
	ci := &ComputeInstance{gi: gi, id: id, profileID: profileID}
	if id >= gi.nextCI {
		gi.nextCI = id + 1
	}
	ci.migDevice = &MigDevice{ci: ci, UUID: "MIG-" + uuid.NewSHA1(uuid.NameSpaceOID,
		fmt.Appendf(nil, "%s/gi%d/ci%d/%d/%d", gi.dev.UUID, gi.id, id, gi.placement.Start, gi.profile.Info.Id)).String()}
	gi.cis[id] = ci
	ci.setFuncs()
	return ci
}

func (ci *ComputeInstance) setFuncs() {
	gi := ci.gi
	ci.GetInfoFunc = func() (nvml.ComputeInstanceInfo, nvml.Return) {
		return nvml.ComputeInstanceInfo{Device: gi.dev, GpuInstance: gi, Id: ci.id, ProfileId: ci.profileID}, nvml.SUCCESS
	}
	ci.DestroyFunc = func() nvml.Return {
		s := gi.dev.srv
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := gi.cis[ci.id]; !ok {
			return nvml.ERROR_NOT_FOUND
		}
		delete(gi.cis, ci.id)
		return s.saveLocked()
	}
	md := ci.migDevice
	md.GetUUIDFunc = func() (string, nvml.Return) { return md.UUID, nvml.SUCCESS }
	md.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return true, nvml.SUCCESS }
	gi.dev.srv.processFuncs(md.UUID, &md.GetComputeRunningProcessesFunc, &md.GetProcessUtilizationFunc)
	md.GetGpuInstanceIdFunc = func() (int, nvml.Return) { return int(gi.id), nvml.SUCCESS }
	md.GetComputeInstanceIdFunc = func() (int, nvml.Return) { return int(ci.id), nvml.SUCCESS }
	md.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) { return gi.dev, nvml.SUCCESS }
	md.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		total := gi.profile.Info.MemorySizeMB << 20
		return nvml.Memory{Total: total, Free: total}, nvml.SUCCESS
	}
	md.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		return nvml.DeviceAttributes{
			MultiprocessorCount:   gi.profile.Info.MultiprocessorCount,
			GpuInstanceSliceCount: gi.profile.Info.SliceCount,
			MemorySizeMB:          gi.profile.Info.MemorySizeMB,
		}, nvml.SUCCESS
	}
}

func copy8(dst []int8, s string) {
	for i := 0; i < len(s) && i < len(dst)-1; i++ {
		dst[i] = int8(s[i])
	}
}
