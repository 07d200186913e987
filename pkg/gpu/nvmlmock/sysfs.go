package nvmlmock

import (
	"fmt"
	"io/fs"
	"testing/fstest"
)

// pciBus is mock GPU index's PCI bus number.
func pciBus(index int) uint32 { return uint32(0x10 + index) }

// Topology is where mock GPU index of a node of n GPUs sits: nodes of four
// or more GPUs pair them behind one PCIe root complex each (as DGX systems
// pair two GPUs and a NIC behind a switch) and split them over two NUMA
// nodes; smaller nodes have one root complex, pci0000:00, on NUMA node 0.
func Topology(index, n int) (pcieRoot string, numaNode int) {
	if n < 4 {
		return "pci0000:00", 0
	}
	return fmt.Sprintf("pci0000:%02x", 0x10+index/2*0x10), index * 2 / n
}

// SysFS is the part of /sys that discovery reads for the mock GPUs'
// topology: bus/pci/devices/<bus ID> links into devices/<root>/<bus ID>,
// whose numa_node holds the NUMA node. The same upstream helpers read it
// as they read a real node's /sys.
func (s *Server) SysFS() fs.ReadLinkFS {
	fsys := fstest.MapFS{}
	for _, d := range s.devices {
		bus := fmt.Sprintf("0000:%02x:00.0", pciBus(d.Index))
		root, numa := Topology(d.Index, len(s.devices))
		dir := "devices/" + root + "/" + bus
		fsys["bus/pci/devices/"+bus] = &fstest.MapFile{Data: []byte("../../../" + dir), Mode: fs.ModeSymlink}
		fsys[dir+"/numa_node"] = &fstest.MapFile{Data: fmt.Appendf(nil, "%d\n", numa)}
	}
	return fsys
}
