package discover_test

import (
	"context"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-dev/tessera/pkg/gpu/discover"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
)

func TestMIGProfileNamesMatchNvidiaSmi(t *testing.T) {
	for _, tc := range []struct {
		model string
		want  []string
	}{
		{"a100-40gb", []string{"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}},
		{"h100-80gb", []string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}},
		{"h200-141gb", []string{"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"}},
		{"b200-180gb", []string{"1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"}},
	} {
		t.Run(tc.model, func(t *testing.T) {
			spec, err := nvmlmock.ParseProfile(tc.model)
			if err != nil {
				t.Fatal(err)
			}
			srv, err := nvmlmock.New(nvmlmock.Options{Spec: spec, MIGEnabled: true})
			if err != nil {
				t.Fatal(err)
			}
			inv, err := discover.Discover(context.Background(), srv)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range inv.GPUs[0].MIGProfiles {
				got = append(got, p.Name)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("profiles %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("profiles %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestDiscoverNonMIGAttributes(t *testing.T) {
	spec, _ := nvmlmock.ParseProfile("t4:2,l4")
	srv, err := nvmlmock.New(nvmlmock.Options{Spec: spec, Seed: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := discover.Discover(context.Background(), srv)
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) != 3 {
		t.Fatalf("%d GPUs", len(inv.GPUs))
	}
	g := inv.GPUs[2]
	if g.ProductName != "NVIDIA L4" || g.Architecture != "Ada Lovelace" || g.CUDAComputeCap != "8.9" || g.MIGCapable || g.PCIBusID != "0000:12:00.0" || g.MemoryBytes != 23034<<20 {
		t.Fatalf("unexpected L4: %+v", g)
	}
	// UUIDs are stable for a node and differ between nodes.
	srv2, _ := nvmlmock.New(nvmlmock.Options{Spec: spec, Seed: "n1"})
	srv3, _ := nvmlmock.New(nvmlmock.Options{Spec: spec, Seed: "n2"})
	inv2, _ := discover.Discover(context.Background(), srv2)
	inv3, _ := discover.Discover(context.Background(), srv3)
	if inv2.GPUs[0].UUID != inv.GPUs[0].UUID || inv3.GPUs[0].UUID == inv.GPUs[0].UUID {
		t.Fatal("mock UUIDs must be stable per node and distinct across nodes")
	}
}

// failingLib makes one NVML call fail.
type failingLib struct {
	*nvmlmock.Server
}

func (f failingLib) DeviceGetCount() (int, nvml.Return) { return 0, nvml.ERROR_DRIVER_NOT_LOADED }

func TestDiscoverReportsNVMLFailure(t *testing.T) {
	spec, _ := nvmlmock.ParseProfile("t4")
	srv, _ := nvmlmock.New(nvmlmock.Options{Spec: spec})
	_, err := discover.Discover(context.Background(), failingLib{srv})
	if err == nil || !strings.HasPrefix(err.Error(), "get device count: ") {
		t.Fatalf("error %v", err)
	}
}

// A whole GPU's SM count comes from its CUDA cores when
// nvmlDeviceGetAttributes reports none (what a real H200 did with MIG off).
func TestDiscoverMultiprocessorsOfWholeGPUs(t *testing.T) {
	for _, tc := range []struct {
		model string
		want  int
	}{
		{"t4", 40}, {"a10", 72}, {"a100-40gb", 108}, {"h100-80gb", 132}, {"h200-141gb", 132},
	} {
		t.Run(tc.model, func(t *testing.T) {
			spec, err := nvmlmock.ParseProfile(tc.model)
			if err != nil {
				t.Fatal(err)
			}
			srv, err := nvmlmock.New(nvmlmock.Options{Spec: spec})
			if err != nil {
				t.Fatal(err)
			}
			if a, _ := srv.Devices()[0].GetAttributes(); a.MultiprocessorCount != 0 {
				t.Fatalf("the mock reports %d SMs for a whole GPU; the real driver reports 0", a.MultiprocessorCount)
			}
			inv, err := discover.Discover(context.Background(), srv)
			if err != nil {
				t.Fatal(err)
			}
			if got := inv.GPUs[0].Multiprocessors; got != tc.want {
				t.Errorf("multiprocessors %d, want %d", got, tc.want)
			}
		})
	}
}

func TestCoresPerSM(t *testing.T) {
	for _, tc := range []struct{ major, minor, want int }{
		{7, 0, 64}, {7, 5, 64}, {8, 0, 64}, {8, 6, 128}, {8, 9, 128}, {9, 0, 128}, {10, 0, 128}, {12, 0, 128}, {6, 1, 0}, {11, 0, 0},
	} {
		if got := inventory.CoresPerSM(tc.major, tc.minor); got != tc.want {
			t.Errorf("CoresPerSM(%d.%d) = %d, want %d", tc.major, tc.minor, got, tc.want)
		}
	}
}

// The mock GPUs' topology comes from their own sysfs, read by the same
// upstream helpers as a real node's: a DGX H100 pairs GPUs per root complex
// over two NUMA nodes.
func TestDiscoverMockTopology(t *testing.T) {
	spec, _ := nvmlmock.ParseProfile("dgxh100")
	srv, err := nvmlmock.New(nvmlmock.Options{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := discover.Discover(context.Background(), srv)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range inv.GPUs {
		root, numa := nvmlmock.Topology(i, len(inv.GPUs))
		if g.Topology.PCIeRoot != root || !g.Topology.HasNUMANode || g.Topology.NUMANode != numa {
			t.Errorf("GPU %d (%s): topology %+v, want root %s NUMA %d", i, g.PCIBusID, g.Topology, root, numa)
		}
	}
	if inv.GPUs[0].Topology.PCIeRoot != inv.GPUs[1].Topology.PCIeRoot || inv.GPUs[1].Topology.PCIeRoot == inv.GPUs[2].Topology.PCIeRoot {
		t.Errorf("GPUs 0 and 1 share a root, 2 has its own: %+v", inv.GPUs[:3])
	}
	if inv.GPUs[3].Topology.NUMANode != 0 || inv.GPUs[4].Topology.NUMANode != 1 {
		t.Errorf("GPUs 0-3 on NUMA 0, 4-7 on NUMA 1: %+v", inv.GPUs)
	}
}
