// Package discover reads the node's GPUs through nvml.Interface into an
// inventory.Inventory. The real library and the mock backend go through exactly this
// code; nothing above nvml.Interface knows which one it talks to.
package discover

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
)

// giProfiles are NVML's GPU instance profile constants, probed in order.
var giProfiles = []int{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE,
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1,
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2,
	nvml.GPU_INSTANCE_PROFILE_2_SLICE,
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1,
	nvml.GPU_INSTANCE_PROFILE_3_SLICE,
	nvml.GPU_INSTANCE_PROFILE_4_SLICE,
	nvml.GPU_INSTANCE_PROFILE_6_SLICE,
	nvml.GPU_INSTANCE_PROFILE_7_SLICE,
	nvml.GPU_INSTANCE_PROFILE_8_SLICE,
}

// CIProfileForSlices maps a slice count to the compute instance profile
// that spans a whole GPU instance of that size.
var CIProfileForSlices = map[int]int{
	1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE,
	2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
	4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	6: nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE,
	7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
	8: nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE,
}

// Error wraps an NVML failure with the call and device that failed.
func nvmlErr(what string, ret nvml.Return) error {
	return fmt.Errorf("%s: %s", what, nvml.ErrorString(ret))
}

// Discover lists every GPU. lib must already be initialised. Each GPU's
// topology comes from the host's /sys, or from lib's own when it is a
// SysFSProvider (the mock GPUs).
func Discover(ctx context.Context, lib nvml.Interface) (*inventory.Inventory, error) {
	logger := klog.FromContext(ctx)
	sysfs := HostSysFS()
	if p, ok := lib.(SysFSProvider); ok {
		sysfs = p.SysFS()
	}
	inv := &inventory.Inventory{}
	var ret nvml.Return
	if inv.DriverVersion, ret = lib.SystemGetDriverVersion(); ret != nvml.SUCCESS {
		return nil, nvmlErr("get driver version", ret)
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		inv.CUDADriverVersion = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, nvmlErr("get device count", ret)
	}
	for i := range count {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("get GPU %d", i), ret)
		}
		gpu, err := discoverGPU(i, dev)
		if err != nil {
			return nil, fmt.Errorf("GPU %d: %w", i, err)
		}
		gpu.Topology = topology(ctx, sysfs, gpu.PCIBusID)
		logger.V(4).Info("Discovered GPU", "index", i, "uuid", gpu.UUID, "product", gpu.ProductName, "mig", gpu.MIGEnabled, "migInstances", len(gpu.MIGInstances))
		inv.GPUs = append(inv.GPUs, *gpu)
	}
	return inv, nil
}

func discoverGPU(index int, dev nvml.Device) (*inventory.GPU, error) {
	g := &inventory.GPU{Index: index}
	var ret nvml.Return
	if g.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
		return nil, nvmlErr("get UUID", ret)
	}
	if g.Minor, ret = dev.GetMinorNumber(); ret != nvml.SUCCESS {
		return nil, nvmlErr("get minor number", ret)
	}
	if g.ProductName, ret = dev.GetName(); ret != nvml.SUCCESS {
		return nil, nvmlErr("get name", ret)
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return nil, nvmlErr("get memory info", ret)
	}
	g.MemoryBytes = mem.Total
	if brand, ret := dev.GetBrand(); ret == nvml.SUCCESS {
		g.Brand = brandName(brand)
	}
	if arch, ret := dev.GetArchitecture(); ret == nvml.SUCCESS {
		g.Architecture = archName(arch)
	}
	if major, minor, ret := dev.GetCudaComputeCapability(); ret == nvml.SUCCESS {
		g.CUDAComputeCap = fmt.Sprintf("%d.%d", major, minor)
	}
	g.Multiprocessors = multiprocessors(dev)
	if pci, ret := dev.GetPciInfo(); ret == nvml.SUCCESS {
		g.PCIBusID = normalizeBusID(int8String(pci.BusId[:]))
	}
	current, _, ret := dev.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		g.MIGCapable = true
		g.MIGEnabled = current == nvml.DEVICE_MIG_ENABLE
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		return nil, nvmlErr("get MIG mode", ret)
	}
	if !g.MIGEnabled {
		return g, nil
	}
	profiles, err := migProfiles(dev, g.MemoryBytes)
	if err != nil {
		return nil, err
	}
	g.MIGProfiles = profiles
	instances, err := MIGInstances(dev, profiles)
	if err != nil {
		return nil, err
	}
	g.MIGInstances = instances
	return g, nil
}

func migProfiles(dev nvml.Device, totalBytes uint64) ([]inventory.MIGProfile, error) {
	var out []inventory.MIGProfile
	for _, id := range giProfiles {
		info, ret := dev.GetGpuInstanceProfileInfo(id)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("get GPU instance profile %d", id), ret)
		}
		pls, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("get placements of GPU instance profile %d", id), ret)
		}
		p := inventory.MIGProfile{
			Name:            ProfileName(id, int(info.SliceCount), info.MemorySizeMB, totalBytes),
			GIProfileID:     id,
			CIProfileID:     CIProfileForSlices[int(info.SliceCount)],
			MemoryBytes:     info.MemorySizeMB << 20,
			SliceCount:      int(info.SliceCount),
			Multiprocessors: int(info.MultiprocessorCount),
			CopyEngines:     int(info.CopyEngineCount),
			Decoders:        int(info.DecoderCount),
			Encoders:        int(info.EncoderCount),
			JPEGs:           int(info.JpegCount),
			OFAs:            int(info.OfaCount),
			InstanceCount:   int(info.InstanceCount),
		}
		for _, pl := range pls {
			p.Placements = append(p.Placements, inventory.Placement{Start: int(pl.Start), Size: int(pl.Size)})
		}
		sort.Slice(p.Placements, func(i, j int) bool { return p.Placements[i].Start < p.Placements[j].Start })
		out = append(out, p)
	}
	return out, nil
}

// MIGInstances lists the MIG devices that exist on dev with their GPU and
// compute instance IDs and placements. Profile names come from profiles
// (matched by GPU instance profile ID); with nil profiles they stay empty.
func MIGInstances(dev nvml.Device, profiles []inventory.MIGProfile) ([]inventory.MIGInstance, error) {
	max, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, nvmlErr("get max MIG device count", ret)
	}
	var out []inventory.MIGInstance
	for i := range max {
		mig, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("get MIG device %d", i), ret)
		}
		var inst inventory.MIGInstance
		if inst.UUID, ret = mig.GetUUID(); ret != nvml.SUCCESS {
			return nil, nvmlErr("get MIG device UUID", ret)
		}
		if inst.GIID, ret = mig.GetGpuInstanceId(); ret != nvml.SUCCESS {
			return nil, nvmlErr("get GPU instance ID", ret)
		}
		if inst.CIID, ret = mig.GetComputeInstanceId(); ret != nvml.SUCCESS {
			return nil, nvmlErr("get compute instance ID", ret)
		}
		gi, ret := dev.GetGpuInstanceById(inst.GIID)
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("get GPU instance %d", inst.GIID), ret)
		}
		info, ret := gi.GetInfo()
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("get info of GPU instance %d", inst.GIID), ret)
		}
		inst.GIProfileID = int(info.ProfileId)
		inst.Placement = inventory.Placement{Start: int(info.Placement.Start), Size: int(info.Placement.Size)}
		for _, p := range profiles {
			if p.GIProfileID == inst.GIProfileID {
				inst.Profile = p.Name
			}
		}
		out = append(out, inst)
	}
	return out, nil
}

// ProfileName names a GPU instance profile as nvidia-smi does: compute
// slices, memory rounded to the eighth of the GPU it occupies, and "+me" for
// the profile with media extensions.
func ProfileName(giProfileID, slices int, memMiB, totalBytes uint64) string {
	totalMiB := float64(totalBytes >> 20)
	frac := math.Ceil(float64(memMiB)/totalMiB*8) / 8
	totalGB := math.Ceil(float64(totalBytes) / (1 << 30))
	name := fmt.Sprintf("%dg.%dgb", slices, int(math.Round(frac*totalGB)))
	if giProfileID == nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1 || giProfileID == nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1 {
		name += "+me"
	}
	return name
}

func brandName(b nvml.BrandType) string {
	switch b {
	case nvml.BRAND_TESLA:
		return "Tesla"
	case nvml.BRAND_QUADRO:
		return "Quadro"
	case nvml.BRAND_GEFORCE:
		return "GeForce"
	case nvml.BRAND_TITAN:
		return "Titan"
	case nvml.BRAND_NVIDIA_RTX:
		return "NvidiaRTX"
	case nvml.BRAND_NVIDIA:
		return "Nvidia"
	default:
		return "Unknown"
	}
}

func archName(a nvml.DeviceArchitecture) string {
	switch a {
	case nvml.DEVICE_ARCH_KEPLER:
		return "Kepler"
	case nvml.DEVICE_ARCH_MAXWELL:
		return "Maxwell"
	case nvml.DEVICE_ARCH_PASCAL:
		return "Pascal"
	case nvml.DEVICE_ARCH_VOLTA:
		return "Volta"
	case nvml.DEVICE_ARCH_TURING:
		return "Turing"
	case nvml.DEVICE_ARCH_AMPERE:
		return "Ampere"
	case nvml.DEVICE_ARCH_ADA:
		return "Ada Lovelace"
	case nvml.DEVICE_ARCH_HOPPER:
		return "Hopper"
	case nvml.DEVICE_ARCH_BLACKWELL:
		return "Blackwell"
	default:
		return "Unknown"
	}
}

func int8String(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

// normalizeBusID turns NVML's "00000000:3B:00.0" into the PCI address form
// "0000:3b:00.0" that resource.kubernetes.io/pciBusID uses.
func normalizeBusID(id string) string {
	id = strings.ToLower(id)
	if dom, rest, ok := strings.Cut(id, ":"); ok && len(dom) == 8 {
		return dom[4:] + ":" + rest
	}
	return id
}

// multiprocessors is the GPU's SM count, 0 when unknown.
// nvmlDeviceGetAttributes fills MultiprocessorCount for MIG devices; for a
// whole GPU with MIG off it returned SUCCESS and 0 on an H200 (driver
// 580.159.04). The count then comes from the CUDA cores and the cores per
// SM of the compute capability (as CUDA's own samples convert them).
func multiprocessors(dev nvml.Device) int {
	if attrs, ret := dev.GetAttributes(); ret == nvml.SUCCESS && attrs.MultiprocessorCount > 0 {
		return int(attrs.MultiprocessorCount)
	}
	cores, ret := dev.GetNumGpuCores()
	if ret != nvml.SUCCESS || cores <= 0 {
		return 0
	}
	major, minor, ret := dev.GetCudaComputeCapability()
	if ret != nvml.SUCCESS {
		return 0
	}
	if per := inventory.CoresPerSM(major, minor); per > 0 && cores%per == 0 {
		return cores / per
	}
	return 0
}
