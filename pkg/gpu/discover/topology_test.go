package discover

import (
	"context"
	"io/fs"
	"testing"
	"testing/fstest"

	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
)

// sysfsOf lays out bus/pci/devices/<bus> -> devices/<path>/<bus> with
// numa_node, as a real node's /sys does.
func sysfsOf(bus, path, numa string) fs.ReadLinkFS {
	dir := "devices/" + path + "/" + bus
	return fstest.MapFS{
		"bus/pci/devices/" + bus: &fstest.MapFile{Data: []byte("../../../" + dir), Mode: fs.ModeSymlink},
		dir + "/numa_node":       &fstest.MapFile{Data: []byte(numa + "\n")},
	}
}

func TestTopology(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sysfs fs.ReadLinkFS
		bus   string
		want  inventory.Topology
	}{
		// The H200 of docs/hardware.md: a VM, no NUMA affinity.
		{"vm without NUMA affinity", sysfsOf("0000:00:06.0", "pci0000:00", "-1"), "0000:00:06.0", inventory.Topology{PCIeRoot: "pci0000:00"}},
		{"behind two switches on NUMA 1", sysfsOf("0000:9a:00.0", "pci0000:97/0000:97:01.0/0000:98:00.0/0000:99:00.0", "1"), "0000:9a:00.0", inventory.Topology{PCIeRoot: "pci0000:97", NUMANode: 1, HasNUMANode: true}},
		{"no such device", sysfsOf("0000:00:06.0", "pci0000:00", "0"), "0000:01:00.0", inventory.Topology{}},
		{"no bus ID", sysfsOf("0000:00:06.0", "pci0000:00", "0"), "", inventory.Topology{}},
		{"bus ID NVML did not normalise", sysfsOf("0000:00:06.0", "pci0000:00", "0"), "00000000:00:06.0", inventory.Topology{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := topology(context.Background(), tc.sysfs, tc.bus); got != tc.want {
				t.Errorf("topology = %+v, want %+v", got, tc.want)
			}
		})
	}
}
