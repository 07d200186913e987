package nvmlmock

import (
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestMIGRefusalsMatchPublishedTables: for every model with a published
// table, the mock reports each row's profile (instances, compute slices,
// engines, placements) and refuses what NVML refuses: placements not in
// the table, overlapping memory slices, more instances than the row
// allows, and a second media-extension (+me) instance.
func TestMIGRefusalsMatchPublishedTables(t *testing.T) {
	for model, table := range PublishedMIG {
		t.Run(model, func(t *testing.T) {
			spec, err := ParseProfile(model)
			if err != nil {
				t.Fatal(err)
			}
			fresh := func() *Device {
				srv, err := New(Options{Spec: spec, Seed: "n", MIGEnabled: true})
				if err != nil {
					t.Fatal(err)
				}
				return srv.Devices()[0]
			}
			for _, row := range table {
				d := fresh()
				info, ret := d.GetGpuInstanceProfileInfo(row.GIProfileID)
				if ret != nvml.SUCCESS {
					t.Fatalf("%s: profile %d: %v", row.Name, row.GIProfileID, ret)
				}
				if int(info.InstanceCount) != row.Instances || int(info.SliceCount) != row.ComputeSlices || int(info.CopyEngineCount) != row.CopyEngines ||
					int(info.DecoderCount) != row.Decoders || int(info.JpegCount) != row.JPEGs || int(info.OfaCount) != row.OFAs {
					t.Errorf("%s: mock profile %+v differs from the published row %+v", row.Name, info, row)
				}
				pls, _ := d.GetGpuInstancePossiblePlacements(&info)
				var starts []int
				for _, pl := range pls {
					starts = append(starts, int(pl.Start))
					if int(pl.Size) != row.PlacementSize {
						t.Errorf("%s: placement size %d, table %d", row.Name, pl.Size, row.PlacementSize)
					}
				}
				if !slices.Equal(starts, row.Starts) {
					t.Errorf("%s: placements %v, table %v", row.Name, starts, row.Starts)
				}
				// A start the table does not list is refused.
				for s := range 8 {
					if slices.Contains(row.Starts, s) {
						continue
					}
					if _, ret := createGI(d, row.GIProfileID, uint32(s), uint32(row.PlacementSize)); ret == nvml.SUCCESS {
						t.Errorf("%s: created at unlisted start %d", row.Name, s)
					}
				}
				// Instances up to the published count, then refused at
				// every remaining placement.
				created := 0
				for _, s := range row.Starts {
					_, ret := createGI(d, row.GIProfileID, uint32(s), uint32(row.PlacementSize))
					if created < row.Instances {
						if ret != nvml.SUCCESS {
							t.Errorf("%s: instance %d at %d refused: %v", row.Name, created+1, s, ret)
						}
						created++
						continue
					}
					if ret == nvml.SUCCESS {
						t.Errorf("%s: instance %d at %d created, table allows %d", row.Name, created+1, s, row.Instances)
					}
				}
				// Overlap: the first placement again is refused.
				if _, ret := createGI(d, row.GIProfileID, uint32(row.Starts[0]), uint32(row.PlacementSize)); ret == nvml.SUCCESS {
					t.Errorf("%s: created twice at %d", row.Name, row.Starts[0])
				}
			}
			// The full GPU profile uses the only OFA unit: no +me next to
			// anything that holds it, and a +me blocks a second one.
			d := fresh()
			var me PublishedMIGProfile
			for _, row := range table {
				if row.OFAs > 0 && row.MemorySlices == 1 {
					me = row
				}
			}
			if _, ret := createGI(d, me.GIProfileID, 6, 1); ret != nvml.SUCCESS {
				t.Fatalf("%s at 6: %v", me.Name, ret)
			}
			if _, ret := createGI(d, me.GIProfileID, 0, 1); ret == nvml.SUCCESS {
				t.Errorf("a second %s was created", me.Name)
			}
		})
	}
}

// TestMIGEngineAccounting: the mock refuses an instance whose compute
// slices or engines the GPU no longer has, even where memory slices are
// free (the full profile's figures are the GPU's).
func TestMIGEngineAccounting(t *testing.T) {
	_, d := newH100(t, "")
	// Two 3g at 0 and 4 use 6 of 7 compute slices and 6 of 7 decoders.
	for _, s := range []uint32{0, 4} {
		if _, ret := createGI(d, nvml.GPU_INSTANCE_PROFILE_3_SLICE, s, 4); ret != nvml.SUCCESS {
			t.Fatalf("3g at %d: %v", s, ret)
		}
	}
	if !d.fitsLocked(d.Model.MIG[0].Info) {
		t.Fatal("a 1-slice profile should still fit the engines")
	}
	two := d.Model.MIG[3].Info
	if two.SliceCount != 2 || d.fitsLocked(two) {
		t.Fatalf("a 2-slice profile must not fit 1 free compute slice (%+v)", two)
	}
}
