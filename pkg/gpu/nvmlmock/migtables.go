package nvmlmock

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// PublishedMIGProfile is one row of a "Supported MIG Profiles" table of
// NVIDIA's MIG user guide (docs.nvidia.com/datacenter/tesla/mig-user-guide),
// with the placements the guide's placement figures (and `nvidia-smi mig
// -lgipp` on the card) show. These are written from the published tables,
// not from the mock: the mock's GPUs are built from them, and the tests of
// the mock and of the device model hold both against them.
type PublishedMIGProfile struct {
	// Name as nvidia-smi prints it.
	Name string
	// GIProfileID is NVML's GPU instance profile ID for the row.
	GIProfileID int
	// ComputeSlices is the "Fraction of SMs" numerator (sevenths).
	ComputeSlices int
	// MemorySlices is the "Fraction of Memory" numerator (eighths).
	MemorySlices int
	// Instances is "Number of Instances Available".
	Instances   int
	CopyEngines int
	// Decoders, JPEGs and OFAs are the "Hardware Units" column.
	Decoders, JPEGs, OFAs int
	// Starts are the placements' first memory slices; each spans
	// PlacementSize memory slices.
	Starts        []int
	PlacementSize int
}

var (
	all7 = []int{0, 1, 2, 3, 4, 5, 6}
	// The placement figures are the same on A100, H100 and H200.
	placement1g       = all7
	placement1gDouble = []int{0, 2, 4, 6}
	placement2g       = []int{0, 2, 4}
	placement3g       = []int{0, 4}
	placement4g       = []int{0}
	placement7g       = []int{0}
)

// ampereMIG is the A100 table (40GB: 1g.5gb ... 7g.40gb; 80GB: 1g.10gb ...
// 7g.80gb): names differ, engines and placements do not.
func ampereMIG(gb1, gb2, gb4, gbFull string) []PublishedMIGProfile {
	return []PublishedMIGProfile{
		{Name: "1g." + gb1, GIProfileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE, ComputeSlices: 1, MemorySlices: 1, Instances: 7, CopyEngines: 1, Decoders: 0, JPEGs: 0, OFAs: 0, Starts: placement1g, PlacementSize: 1},
		{Name: "1g." + gb1 + "+me", GIProfileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, ComputeSlices: 1, MemorySlices: 1, Instances: 1, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, Starts: placement1g, PlacementSize: 1},
		{Name: "1g." + gb2, GIProfileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, ComputeSlices: 1, MemorySlices: 2, Instances: 4, CopyEngines: 1, Decoders: 1, JPEGs: 0, OFAs: 0, Starts: placement1gDouble, PlacementSize: 2},
		{Name: "2g." + gb2, GIProfileID: nvml.GPU_INSTANCE_PROFILE_2_SLICE, ComputeSlices: 2, MemorySlices: 2, Instances: 3, CopyEngines: 2, Decoders: 1, JPEGs: 0, OFAs: 0, Starts: placement2g, PlacementSize: 2},
		{Name: "3g." + gb4, GIProfileID: nvml.GPU_INSTANCE_PROFILE_3_SLICE, ComputeSlices: 3, MemorySlices: 4, Instances: 2, CopyEngines: 3, Decoders: 2, JPEGs: 0, OFAs: 0, Starts: placement3g, PlacementSize: 4},
		{Name: "4g." + gb4, GIProfileID: nvml.GPU_INSTANCE_PROFILE_4_SLICE, ComputeSlices: 4, MemorySlices: 4, Instances: 1, CopyEngines: 4, Decoders: 2, JPEGs: 0, OFAs: 0, Starts: placement4g, PlacementSize: 4},
		{Name: "7g." + gbFull, GIProfileID: nvml.GPU_INSTANCE_PROFILE_7_SLICE, ComputeSlices: 7, MemorySlices: 8, Instances: 1, CopyEngines: 7, Decoders: 5, JPEGs: 1, OFAs: 1, Starts: placement7g, PlacementSize: 8},
	}
}

// hopperMIG is the H100 / H200 table (H100 80GB: 1g.10gb ... 7g.80gb;
// H200: 1g.18gb ... 7g.141gb).
func hopperMIG(gb1, gb2, gb4, gbFull string) []PublishedMIGProfile {
	return []PublishedMIGProfile{
		{Name: "1g." + gb1, GIProfileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE, ComputeSlices: 1, MemorySlices: 1, Instances: 7, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 0, Starts: placement1g, PlacementSize: 1},
		{Name: "1g." + gb1 + "+me", GIProfileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, ComputeSlices: 1, MemorySlices: 1, Instances: 1, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, Starts: placement1g, PlacementSize: 1},
		{Name: "1g." + gb2, GIProfileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, ComputeSlices: 1, MemorySlices: 2, Instances: 4, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 0, Starts: placement1gDouble, PlacementSize: 2},
		{Name: "2g." + gb2, GIProfileID: nvml.GPU_INSTANCE_PROFILE_2_SLICE, ComputeSlices: 2, MemorySlices: 2, Instances: 3, CopyEngines: 2, Decoders: 2, JPEGs: 2, OFAs: 0, Starts: placement2g, PlacementSize: 2},
		{Name: "3g." + gb4, GIProfileID: nvml.GPU_INSTANCE_PROFILE_3_SLICE, ComputeSlices: 3, MemorySlices: 4, Instances: 2, CopyEngines: 3, Decoders: 3, JPEGs: 3, OFAs: 0, Starts: placement3g, PlacementSize: 4},
		{Name: "4g." + gb4, GIProfileID: nvml.GPU_INSTANCE_PROFILE_4_SLICE, ComputeSlices: 4, MemorySlices: 4, Instances: 1, CopyEngines: 4, Decoders: 4, JPEGs: 4, OFAs: 0, Starts: placement4g, PlacementSize: 4},
		{Name: "7g." + gbFull, GIProfileID: nvml.GPU_INSTANCE_PROFILE_7_SLICE, ComputeSlices: 7, MemorySlices: 8, Instances: 1, CopyEngines: 8, Decoders: 7, JPEGs: 7, OFAs: 1, Starts: placement7g, PlacementSize: 8},
	}
}

// PublishedMIG holds the published tables by mock model name.
var PublishedMIG = map[string][]PublishedMIGProfile{
	"a100-40gb":  ampereMIG("5gb", "10gb", "20gb", "40gb"),
	"a100-80gb":  ampereMIG("10gb", "20gb", "40gb", "80gb"),
	"h100-80gb":  hopperMIG("10gb", "20gb", "40gb", "80gb"),
	"h200-141gb": hopperMIG("18gb", "35gb", "71gb", "141gb"),
}

// migFromTable builds a mock model's GPU instance profiles from a
// published table. memMiB maps memory slices (1, 2, 4, 8) to the MiB NVML
// reports for the profile; sms maps compute slices to SMs.
func migFromTable(table []PublishedMIGProfile, memMiB map[int]uint64, sms map[int]uint32) []MIGProfile {
	out := make([]MIGProfile, 0, len(table))
	for _, r := range table {
		starts := make([]uint32, 0, len(r.Starts))
		for _, s := range r.Starts {
			starts = append(starts, uint32(s))
		}
		out = append(out, profile(uint32(r.GIProfileID), uint32(r.ComputeSlices), uint32(r.Instances), sms[r.ComputeSlices],
			uint32(r.CopyEngines), uint32(r.Decoders), uint32(r.JPEGs), uint32(r.OFAs), memMiB[r.MemorySlices],
			placements(uint32(r.PlacementSize), starts...)))
	}
	return out
}
