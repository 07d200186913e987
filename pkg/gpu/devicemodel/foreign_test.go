package devicemodel_test

import (
	"context"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/discover"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/gpu/nodeslices"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
)

// foreignNode is one H100 in MIG mode with instances made by hand before
// the plugin starts; the mock keeps them, so what the allocator picks is
// created on the same GPU, as prepare does.
type foreignNode struct {
	t      *testing.T
	srv    *nvmlmock.Server
	inv    *inventory.Inventory
	slices []*resourceapi.ResourceSlice
}

func newForeignNode(t *testing.T, byHand map[string]int) *foreignNode {
	t.Helper()
	return newMIGNode(t, "h100-80gb", byHand)
}

// newMIGNode is one mock GPU of model in MIG mode with instances made by
// hand (profile name -> placement start).
func newMIGNode(t *testing.T, model string, byHand map[string]int) *foreignNode {
	t.Helper()
	spec, err := nvmlmock.ParseProfile(model)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := nvmlmock.New(nvmlmock.Options{Spec: spec, Seed: nodeName, MIGEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	n := &foreignNode{t: t, srv: srv}
	n.rediscover()
	for profile, start := range byHand {
		if ret := n.create(profile, start); ret != nvml.SUCCESS {
			t.Fatalf("create %s at %d by hand: %v", profile, start, ret)
		}
	}
	n.rediscover()
	return n
}

func (n *foreignNode) rediscover() {
	inv, err := discover.Discover(context.Background(), n.srv)
	if err != nil {
		n.t.Fatal(err)
	}
	n.inv = inv
}

// createGI makes the GPU instance of a profile at a placement start.
func (n *foreignNode) createGI(profile string, start int) (nvml.GpuInstance, inventory.MIGProfile, nvml.Return) {
	n.t.Helper()
	dev := n.srv.Devices()[0]
	for _, p := range n.inv.GPUs[0].MIGProfiles {
		if p.Name != profile {
			continue
		}
		for _, pl := range p.Placements {
			if pl.Start != start {
				continue
			}
			info, _ := dev.GetGpuInstanceProfileInfo(p.GIProfileID)
			gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)})
			return gi, p, ret
		}
	}
	n.t.Fatalf("no profile %s with a placement at %d", profile, start)
	return nil, inventory.MIGProfile{}, nvml.ERROR_UNKNOWN
}

// create makes a GPU instance and a full compute instance, as nvidia-smi
// mig -cgi ... -C does.
func (n *foreignNode) create(profile string, start int) nvml.Return {
	n.t.Helper()
	gi, p, ret := n.createGI(profile, start)
	if ret != nvml.SUCCESS {
		return ret
	}
	ci, ret := gi.GetComputeInstanceProfileInfo(p.CIProfileID, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		return ret
	}
	_, ret = gi.CreateComputeInstance(&ci)
	return ret
}

// cluster publishes the node as the plugin does; foreign marks every
// instance that exists now as not created by the plugin.
func (n *foreignNode) cluster(foreign bool) *cluster {
	cfg := devicemodel.Config{ReservedMemory: devicemodel.DefaultReservedMemory, MIGMode: devicemodel.MIGDynamic}
	if foreign {
		cfg.ForeignMIG = func(string, inventory.MIGInstance) bool { return true }
	}
	slices, err := devicemodel.Build(n.inv, cfg)
	if err != nil {
		n.t.Fatal(err)
	}
	n.slices = nodeslices.Objects(nodeName, slices)
	return &cluster{t: n.t, alloc: allocation.NewAllocator(n.slices, shippedClasses(n.t)), state: allocation.NewState()}
}

// prepare creates an allocated device on the GPU, as prepare does.
func (n *foreignNode) prepare(device string) nvml.Return {
	n.t.Helper()
	name, err := devicemodel.ParseName(device)
	if err != nil {
		n.t.Fatal(err)
	}
	for _, p := range n.inv.GPUs[0].MIGProfiles {
		if devicemodel.ProfileToken(p.Name) == name.ProfileToken {
			return n.create(p.Name, name.Start)
		}
	}
	n.t.Fatalf("no profile for %s", device)
	return nvml.ERROR_UNKNOWN
}

// TestForeignMIGInstancesStrandNoClaim: instances the plugin did not create
// take their placements (and their compute slices and profile instances)
// out of what the scheduler may allocate; every claim the real allocator
// places is then creatable next to them.
func TestForeignMIGInstancesStrandNoClaim(t *testing.T) {
	t.Run("without the rule the scheduler picks a blocked placement", func(t *testing.T) {
		// Guards the test itself: the hand-made 1g.10gb at 0 blocks the only
		// 4g.40gb placement, which the unfiltered model offers.
		n := newForeignNode(t, map[string]int{"1g.10gb": 0})
		dev := n.cluster(false).mustPlace(migReq("4g.40gb"))
		if ret := n.prepare(dev); ret == nvml.SUCCESS {
			t.Fatalf("%s was creatable next to the hand-made instance; the test shows nothing", dev)
		}
	})
	for _, tc := range []struct {
		name   string
		byHand map[string]int
		want   []string // placed and prepared, in order
		notFit []string
	}{
		{
			name:   "a 1g.10gb at 0 blocks 4g.40gb and 7g.80gb; 3g.40gb lands at 4",
			byHand: map[string]int{"1g.10gb": 0},
			notFit: []string{"4g.40gb", "7g.80gb"},
			want:   []string{"3g.40gb", "2g.20gb", "1g.10gb"},
		},
		{
			name:   "a hand-made 1g.10gb+me uses the only media-engine instance",
			byHand: map[string]int{"1g.10gb+me": 6},
			notFit: []string{"1g.10gb+me", "7g.80gb"},
			want:   append([]string{"4g.40gb"}, repeat("1g.10gb", 2)...),
		},
		{
			name:   "a 3g.40gb at 4 leaves 0-3: a second 3g.40gb lands at 0 and fills it",
			byHand: map[string]int{"3g.40gb": 4},
			notFit: []string{"7g.80gb"},
			want:   []string{"3g.40gb"},
		},
		{
			name:   "a 3g.40gb at 4 leaves room for 4g.40gb at 0",
			byHand: map[string]int{"3g.40gb": 4},
			want:   []string{"4g.40gb"},
		},
		{
			name:   "a 7g.80gb leaves nothing",
			byHand: map[string]int{"7g.80gb": 0},
			notFit: []string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newForeignNode(t, tc.byHand)
			c := n.cluster(true)
			for _, d := range n.migDevices() {
				name, _ := devicemodel.ParseName(d)
				for _, inst := range n.inv.GPUs[0].MIGInstances {
					size := 0
					for _, p := range n.inv.GPUs[0].MIGProfiles {
						if devicemodel.ProfileToken(p.Name) == name.ProfileToken {
							for _, pl := range p.Placements {
								if pl.Start == name.Start {
									size = pl.Size
								}
							}
						}
					}
					if name.Start < inst.Placement.Start+inst.Placement.Size && inst.Placement.Start < name.Start+size {
						t.Errorf("published %s overlaps the hand-made %s at %d", d, inst.Profile, inst.Placement.Start)
					}
				}
			}
			for _, p := range tc.notFit {
				c.mustNotPlace(migReq(p))
			}
			for _, p := range tc.want {
				dev := c.mustPlace(migReq(p))
				if ret := n.prepare(dev); ret != nvml.SUCCESS {
					t.Fatalf("%s was allocated but cannot be created next to the hand-made instances: %v (placed: %v)", dev, ret, c.devices())
				}
			}
			// Whatever else the scheduler would still place is creatable
			// too: fill the GPU with the smallest profile.
			for {
				dev, ok := c.place(migReq("1g.10gb"))
				if !ok {
					break
				}
				if ret := n.prepare(dev); ret != nvml.SUCCESS {
					t.Fatalf("%s was allocated but cannot be created: %v (placed: %v)", dev, ret, c.devices())
				}
			}
		})
	}
}

// migDevices names every published MIG device.
func (n *foreignNode) migDevices() []string {
	var out []string
	for _, s := range n.slices {
		for _, d := range s.Spec.Devices {
			if strings.Contains(d.Name, "-mig-") {
				out = append(out, d.Name)
			}
		}
	}
	return out
}
