// Package mig creates and destroys MIG GPU and compute instances for
// dynamically partitioned GPUs, through nvml.Interface: the node's NVIDIA
// management library or the mock GPUs, with the same code.
package mig

import (
	"context"
	"fmt"

	"github.com/tessera-dev/tessera/pkg/keymutex"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/gpu/discover"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
)

// Instance is one MIG device: a GPU instance at a placement with one
// compute instance spanning it. The claim checkpoint stores it as is: its
// JSON is part of the checkpoint's format (checkpoint.Version; the
// checkpoint's golden files fail on any change).
type Instance struct {
	GPUUUID     string `json:"gpuUUID"`
	GPUMinor    int    `json:"gpuMinor"`
	Profile     string `json:"profile"`
	GIProfileID int    `json:"giProfileID"`
	CIProfileID int    `json:"ciProfileID"`
	Start       int    `json:"start"`
	Size        int    `json:"size"`
	// GIID and CIID are NVML's instance IDs; -1 while unknown.
	GIID int    `json:"giID"`
	CIID int    `json:"ciID"`
	UUID string `json:"uuid,omitempty"`
	// Created says this plugin created the instance (dynamic MIG) and must
	// destroy it; static instances are only used.
	Created bool `json:"created"`
}

// String names the instance for messages.
func (i Instance) String() string {
	return fmt.Sprintf("MIG %s at placement %d on GPU %s (GPU instance %d, compute instance %d)", i.Profile, i.Start, i.GPUUUID, i.GIID, i.CIID)
}

// Manager creates and destroys instances; operations on one GPU are
// serialized.
type Manager struct {
	lib   nvml.Interface
	locks keymutex.Mutex
}

// New returns a manager over an initialised library.
func New(lib nvml.Interface) *Manager {
	return &Manager{lib: lib}
}

// Lock serializes MIG changes on one GPU; callers that check and then
// create hold it across both.
func (m *Manager) Lock(gpuUUID string) func() { return m.locks.Lock(gpuUUID) }

func nvmlErr(what string, ret nvml.Return) error {
	return fmt.Errorf("%s: %s", what, nvml.ErrorString(ret))
}

func (m *Manager) device(gpuUUID string) (nvml.Device, error) {
	dev, ret := m.lib.DeviceGetHandleByUUID(gpuUUID)
	if ret != nvml.SUCCESS {
		return nil, nvmlErr("get GPU "+gpuUUID, ret)
	}
	return dev, nil
}

// Template is what to create: a profile at a placement of a GPU.
func Template(gpu inventory.GPU, p inventory.MIGProfile, start int) (Instance, error) {
	for _, pl := range p.Placements {
		if pl.Start == start {
			return Instance{
				GPUUUID: gpu.UUID, GPUMinor: gpu.Minor, Profile: p.Name,
				GIProfileID: p.GIProfileID, CIProfileID: p.CIProfileID,
				Start: pl.Start, Size: pl.Size, GIID: -1, CIID: -1,
			}, nil
		}
	}
	return Instance{}, fmt.Errorf("MIG profile %s has no placement starting at %d on GPU %d", p.Name, start, gpu.Index)
}

// List returns every MIG device on a GPU with its placement; CIProfileID
// is -1 (not known from the MIG device handle).
func (m *Manager) List(ctx context.Context, gpuUUID string) ([]Instance, error) {
	dev, err := m.device(gpuUUID)
	if err != nil {
		return nil, err
	}
	found, err := discover.MIGInstances(dev, nil)
	if err != nil {
		return nil, err
	}
	out := make([]Instance, 0, len(found))
	for _, mi := range found {
		out = append(out, Instance{
			GPUUUID: gpuUUID, UUID: mi.UUID, GIID: mi.GIID, CIID: mi.CIID, GIProfileID: mi.GIProfileID,
			CIProfileID: -1, Start: mi.Placement.Start, Size: mi.Placement.Size,
		})
	}
	return out, nil
}

// Find returns the GPU instance of the template's profile at its placement
// with its compute instances' IDs and UUID, or nil when there is none.
// The caller holds Lock.
func (m *Manager) Find(ctx context.Context, t Instance) (*Instance, error) {
	all, err := m.List(ctx, t.GPUUUID)
	if err != nil {
		return nil, err
	}
	for _, inst := range all {
		if inst.GIProfileID == t.GIProfileID && inst.Start == t.Start {
			out := t
			out.GIID, out.CIID, out.UUID = inst.GIID, inst.CIID, inst.UUID
			return &out, nil
		}
	}
	// A GPU instance without a compute instance has no MIG device handle.
	dev, err := m.device(t.GPUUUID)
	if err != nil {
		return nil, err
	}
	info, ret := dev.GetGpuInstanceProfileInfo(t.GIProfileID)
	if ret != nvml.SUCCESS {
		return nil, nvmlErr(fmt.Sprintf("get GPU instance profile %d", t.GIProfileID), ret)
	}
	gis, ret := dev.GetGpuInstances(&info)
	if ret != nvml.SUCCESS {
		return nil, nvmlErr("list GPU instances", ret)
	}
	for _, gi := range gis {
		gii, ret := gi.GetInfo()
		if ret != nvml.SUCCESS {
			return nil, nvmlErr("get GPU instance info", ret)
		}
		if int(gii.Placement.Start) == t.Start {
			out := t
			out.GIID, out.CIID = int(gii.Id), -1
			return &out, nil
		}
	}
	return nil, nil
}

// Create creates the GPU instance at the template's placement and a
// compute instance spanning it. afterGI, if set, runs once the GPU
// instance exists (to record its ID before the next step). On error,
// whatever was created is destroyed again; a non-nil instance with an
// error means that failed too and the instance is left. The caller holds
// Lock.
func (m *Manager) Create(ctx context.Context, t Instance, afterGI func(Instance) error) (*Instance, error) {
	logger := klog.FromContext(ctx)
	dev, err := m.device(t.GPUUUID)
	if err != nil {
		return nil, err
	}
	info, ret := dev.GetGpuInstanceProfileInfo(t.GIProfileID)
	if ret != nvml.SUCCESS {
		return nil, nvmlErr(fmt.Sprintf("get GPU instance profile %s", t.Profile), ret)
	}
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(t.Start), Size: uint32(t.Size)})
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("create MIG GPU instance %s at placement %d on GPU %s: %s (is the placement used by an instance Tessera did not create?)",
			t.Profile, t.Start, t.GPUUUID, nvml.ErrorString(ret))
	}
	gii, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		_ = gi.Destroy()
		return nil, nvmlErr("get info of the new GPU instance", ret)
	}
	out := t
	out.GIID, out.CIID, out.Created = int(gii.Id), -1, true
	if afterGI != nil {
		if err := afterGI(out); err != nil {
			if derr := m.Destroy(ctx, out); derr != nil {
				logger.Error(derr, "Could not destroy the GPU instance of a failed MIG creation", "instance", out.String())
				return &out, err
			}
			return nil, err
		}
	}
	if err := m.createCI(ctx, gi, &out); err != nil {
		if derr := m.Destroy(ctx, out); derr != nil {
			logger.Error(derr, "Could not destroy the GPU instance of a failed MIG creation", "instance", out.String())
			return &out, err
		}
		return nil, err
	}
	logger.V(2).Info("Created MIG device", "instance", out.String(), "uuid", out.UUID)
	return &out, nil
}

func (m *Manager) createCI(ctx context.Context, gi nvml.GpuInstance, out *Instance) error {
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(out.CIProfileID, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		return nvmlErr(fmt.Sprintf("get compute instance profile %d", out.CIProfileID), ret)
	}
	ci, ret := gi.CreateComputeInstance(&ciInfo)
	if ret != nvml.SUCCESS {
		return nvmlErr("create MIG compute instance", ret)
	}
	cii, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return nvmlErr("get info of the new compute instance", ret)
	}
	out.CIID = int(cii.Id)
	found, err := m.Find(ctx, *out)
	if err != nil {
		return err
	}
	if found == nil || found.UUID == "" {
		return fmt.Errorf("MIG device of %s has no UUID", out.String())
	}
	out.UUID = found.UUID
	return nil
}

// EnsureCI creates the compute instance of a GPU instance that has none
// (a creation interrupted between the two steps). The caller holds Lock.
func (m *Manager) EnsureCI(ctx context.Context, inst *Instance) error {
	if inst.CIID >= 0 && inst.UUID != "" {
		return nil
	}
	dev, err := m.device(inst.GPUUUID)
	if err != nil {
		return err
	}
	gi, ret := dev.GetGpuInstanceById(inst.GIID)
	if ret != nvml.SUCCESS {
		return nvmlErr(fmt.Sprintf("get GPU instance %d", inst.GIID), ret)
	}
	return m.createCI(ctx, gi, inst)
}

// Destroy destroys the compute instances and the GPU instance (with
// CIProfileID < 0, compute instances of every profile: an instance Tessera
// did not create). An
// instance that is gone is fine; a GPU instance ID that now belongs to a
// different profile or placement is left alone. The caller holds Lock.
func (m *Manager) Destroy(ctx context.Context, inst Instance) error {
	if inst.GIID < 0 {
		return nil
	}
	dev, err := m.device(inst.GPUUUID)
	if err != nil {
		return err
	}
	gi, ret := dev.GetGpuInstanceById(inst.GIID)
	if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
		return nil
	}
	if ret != nvml.SUCCESS {
		return nvmlErr(fmt.Sprintf("get GPU instance %d", inst.GIID), ret)
	}
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return nvmlErr(fmt.Sprintf("get info of GPU instance %d", inst.GIID), ret)
	}
	if int(info.ProfileId) != inst.GIProfileID || int(info.Placement.Start) != inst.Start {
		klog.FromContext(ctx).Info("GPU instance ID now names a different instance; leaving it alone", "instance", inst.String(),
			"profileID", info.ProfileId, "start", info.Placement.Start)
		return nil
	}
	ciProfiles := []int{inst.CIProfileID}
	if inst.CIProfileID < 0 {
		// Not created by Tessera: its compute instances may be of any
		// profile.
		ciProfiles = ciProfiles[:0]
		for id := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
			ciProfiles = append(ciProfiles, id)
		}
	}
	for _, ciProfile := range ciProfiles {
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciProfile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			continue
		}
		cis, ret := gi.GetComputeInstances(&ciInfo)
		if ret != nvml.SUCCESS {
			return nvmlErr("list compute instances", ret)
		}
		for _, ci := range cis {
			if ret := ci.Destroy(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_FOUND {
				return nvmlErr(fmt.Sprintf("destroy compute instance of %s", inst.String()), ret)
			}
		}
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_FOUND {
		return nvmlErr(fmt.Sprintf("destroy %s", inst.String()), ret)
	}
	klog.FromContext(ctx).V(2).Info("Destroyed MIG device", "instance", inst.String())
	return nil
}
