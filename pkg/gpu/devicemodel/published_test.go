package devicemodel_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
)

// TestDeviceModelMatchesPublishedMIGTables holds what Tessera publishes
// for a MIG GPU against NVIDIA's published profile tables
// (nvmlmock.PublishedMIG, transcribed from the MIG user guide): every
// profile with its placements and engines, exactly the published number
// of instances per profile through the real allocator, and, for random
// mixes, the allocator accepts a claim exactly when the GPU can still
// create an instance of its profile.
func TestDeviceModelMatchesPublishedMIGTables(t *testing.T) {
	for model, table := range nvmlmock.PublishedMIG {
		t.Run(model, func(t *testing.T) {
			n := newMIGNode(t, model, nil)
			n.cluster(true)
			published := map[string][]int{}
			for _, s := range n.slices {
				for _, d := range s.Spec.Devices {
					prof := d.Attributes[devicemodel.AttrMIGProfile].StringValue
					if prof == nil {
						continue
					}
					published[*prof] = append(published[*prof], int(*d.Attributes[devicemodel.AttrPlacementStart].IntValue))
					for _, row := range table {
						if row.Name != *prof {
							continue
						}
						for capName, want := range map[string]int{
							devicemodel.CapCopyEngines: row.CopyEngines, devicemodel.CapDecoders: row.Decoders,
							devicemodel.CapJPEGs: row.JPEGs, devicemodel.CapOFAs: row.OFAs,
						} {
							c := d.Capacity[resourceapi.QualifiedName(capName)]
							if got := c.Value.Value(); got != int64(want) {
								t.Errorf("%s: capacity %s = %d, published table says %d", d.Name, capName, got, want)
							}
						}
					}
				}
			}
			if len(published) != len(table) {
				t.Errorf("published profiles %v, table has %d rows", published, len(table))
			}
			for _, row := range table {
				got := published[row.Name]
				slices.Sort(got)
				if !slices.Equal(got, row.Starts) {
					t.Errorf("%s: published placements %v, table %v", row.Name, got, row.Starts)
				}
				// Exactly the published number of instances fits an empty GPU.
				c := n.cluster(true)
				for i := range row.Instances {
					if _, ok := c.place(migReq(row.Name)); !ok {
						t.Errorf("%s: instance %d of %d does not fit", row.Name, i+1, row.Instances)
					}
				}
				c.mustNotPlace(migReq(row.Name))
			}
			// Random mixes: the allocator and the GPU (the mock, built from
			// the same table) agree claim by claim.
			rng := rand.New(rand.NewPCG(1, uint64(len(model))))
			for round := range 40 {
				n := newMIGNode(t, model, nil)
				c := n.cluster(true)
				for range 12 {
					row := table[rng.IntN(len(table))]
					dev, ok := c.place(migReq(row.Name))
					if ok {
						if ret := n.prepare(dev); ret != nvml.SUCCESS {
							t.Fatalf("round %d: allocated %s but the GPU refuses it: %v (placed %v)", round, dev, ret, c.devices())
						}
						continue
					}
					for _, start := range row.Starts {
						if ret := n.tryCreate(row.Name, start); ret == nvml.SUCCESS {
							t.Fatalf("round %d: the allocator refused %s but the GPU creates it at %d (placed %v)", round, row.Name, start, c.devices())
						}
					}
				}
			}
		})
	}
}

// tryCreate creates and, on success, destroys again an instance.
func (n *foreignNode) tryCreate(profile string, start int) nvml.Return {
	n.t.Helper()
	gi, _, ret := n.createGI(profile, start)
	if ret == nvml.SUCCESS {
		if r := gi.Destroy(); r != nvml.SUCCESS {
			n.t.Fatalf("destroy: %v", r)
		}
	}
	return ret
}
