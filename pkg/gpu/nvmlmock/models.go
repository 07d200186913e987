package nvmlmock

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Model describes one kind of GPU the mock backend can serve. The figures are
// what NVML reports on real cards of that kind (total memory in MiB as NVML
// reports it, not the marketing size).
type Model struct {
	// Name is what nvmlDeviceGetName returns.
	Name         string
	Architecture nvml.DeviceArchitecture
	Brand        nvml.BrandType
	MemoryMiB    uint64
	// Multiprocessors is the number of SMs (nvmlDeviceGetAttributes).
	Multiprocessors uint32
	CCMajor         int
	CCMinor         int
	PciDeviceID     uint32
	// MIG lists the GPU instance profiles the card supports; empty for
	// cards without MIG.
	MIG []MIGProfile
}

// MIGProfile is one GPU instance profile with its placements, in NVML's
// units: placements are counted in memory slices (eight per GPU).
type MIGProfile struct {
	Info       nvml.GpuInstanceProfileInfo
	Placements []nvml.GpuInstancePlacement
}

func placements(size uint32, starts ...uint32) []nvml.GpuInstancePlacement {
	out := make([]nvml.GpuInstancePlacement, 0, len(starts))
	for _, s := range starts {
		out = append(out, nvml.GpuInstancePlacement{Start: s, Size: size})
	}
	return out
}

func profile(id, slices, instances, sms, ce, dec, jpeg, ofa uint32, memMiB uint64, pl []nvml.GpuInstancePlacement) MIGProfile {
	return MIGProfile{
		Info: nvml.GpuInstanceProfileInfo{
			Id:                  id,
			IsP2pSupported:      1,
			SliceCount:          slices,
			InstanceCount:       instances,
			MultiprocessorCount: sms,
			CopyEngineCount:     ce,
			DecoderCount:        dec,
			JpegCount:           jpeg,
			OfaCount:            ofa,
			MemorySizeMB:        memMiB,
		},
		Placements: pl,
	}
}

// sevenSlice builds a model's MIG profiles from the published table tbl
// (PublishedMIG). mem1, mem2, mem4 and memFull are the MiB NVML reports
// for profiles of 1, 2, 4 and 8 memory slices; sm1, sm3 and smFull the SMs
// of the 1-, 3- and 7-compute-slice profiles (2 and 4 are multiples of sm1).
func sevenSlice(tbl []PublishedMIGProfile, mem1, mem2, mem4, memFull uint64, sm1, sm3, smFull uint32) []MIGProfile {
	return migFromTable(tbl,
		map[int]uint64{1: mem1, 2: mem2, 4: mem4, 8: memFull},
		map[int]uint32{1: sm1, 2: 2 * sm1, 3: sm3, 4: 4 * sm1, 7: smFull})
}

// Models are the single-GPU kinds; names are what --mock-profile takes.
var Models = map[string]Model{
	"t4": {
		Name: "Tesla T4", Architecture: nvml.DEVICE_ARCH_TURING, Brand: nvml.BRAND_NVIDIA,
		MemoryMiB: 15360, Multiprocessors: 40, CCMajor: 7, CCMinor: 5, PciDeviceID: 0x1EB810DE,
	},
	"a10": {
		Name: "NVIDIA A10", Architecture: nvml.DEVICE_ARCH_AMPERE, Brand: nvml.BRAND_NVIDIA,
		MemoryMiB: 23028, Multiprocessors: 72, CCMajor: 8, CCMinor: 6, PciDeviceID: 0x223610DE,
	},
	"l4": {
		Name: "NVIDIA L4", Architecture: nvml.DEVICE_ARCH_ADA, Brand: nvml.BRAND_NVIDIA,
		MemoryMiB: 23034, Multiprocessors: 58, CCMajor: 8, CCMinor: 9, PciDeviceID: 0x27B810DE,
	},
	"a100-40gb": {
		Name: "NVIDIA A100-SXM4-40GB", Architecture: nvml.DEVICE_ARCH_AMPERE, Brand: nvml.BRAND_NVIDIA,
		MemoryMiB: 40960, Multiprocessors: 108, CCMajor: 8, CCMinor: 0, PciDeviceID: 0x20B010DE,
		MIG: sevenSlice(PublishedMIG["a100-40gb"], 4864, 9856, 19968, 40192, 14, 42, 98),
	},
	"a100-80gb": {
		Name: "NVIDIA A100-SXM4-80GB", Architecture: nvml.DEVICE_ARCH_AMPERE, Brand: nvml.BRAND_NVIDIA,
		MemoryMiB: 81920, Multiprocessors: 108, CCMajor: 8, CCMinor: 0, PciDeviceID: 0x20B210DE,
		MIG: sevenSlice(PublishedMIG["a100-80gb"], 9856, 19968, 40192, 80896, 14, 42, 98),
	},
	"h100-80gb": {
		Name: "NVIDIA H100 80GB HBM3", Architecture: nvml.DEVICE_ARCH_HOPPER, Brand: nvml.BRAND_NVIDIA,
		MemoryMiB: 81559, Multiprocessors: 132, CCMajor: 9, CCMinor: 0, PciDeviceID: 0x233010DE,
		MIG: sevenSlice(PublishedMIG["h100-80gb"], 9856, 20096, 40192, 80896, 16, 60, 132),
	},
	"h200-141gb": {
		Name: "NVIDIA H200", Architecture: nvml.DEVICE_ARCH_HOPPER, Brand: nvml.BRAND_NVIDIA,
		MemoryMiB: 143771, Multiprocessors: 132, CCMajor: 9, CCMinor: 0, PciDeviceID: 0x233510DE,
		MIG: sevenSlice(PublishedMIG["h200-141gb"], 17792, 35456, 71040, 142336, 16, 60, 132),
	},
	"b200-180gb": {
		Name: "NVIDIA B200", Architecture: nvml.DEVICE_ARCH_BLACKWELL, Brand: nvml.BRAND_NVIDIA,
		MemoryMiB: 183359, Multiprocessors: 148, CCMajor: 10, CCMinor: 0, PciDeviceID: 0x290110DE,
		// No B200 table is transcribed yet: it reuses the H100 table's
		// engines and placements with B200 memory and SMs.
		MIG: sevenSlice(PublishedMIG["h100-80gb"], 22784, 45824, 91392, 182528, 18, 66, 148),
	},
}

// Nodes are whole-machine shorthands: the DGX systems go-nvml's mock
// servers are named after, each with eight GPUs of one model.
var Nodes = map[string]string{
	"dgxa100": "a100-40gb:8",
	"dgxh100": "h100-80gb:8",
	"dgxh200": "h200-141gb:8",
	"dgxb200": "b200-180gb:8",
}
