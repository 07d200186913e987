// Package inventory is what a node's GPUs are, as plain data: the output of
// discovery and the input of the device model. It has no NVML dependency, so
// the controller and the simulator can reason about devices without linking
// the NVIDIA management library.
package inventory

// Inventory is what the node has, as NVML reports it.
type Inventory struct {
	DriverVersion     string
	CUDADriverVersion string
	GPUs              []GPU
}

// GPU is one physical GPU.
type GPU struct {
	Index          int
	Minor          int
	UUID           string
	ProductName    string
	Brand          string
	Architecture   string
	CUDAComputeCap string
	PCIBusID       string
	// Topology is where the GPU sits, from sysfs; empty when unknown.
	Topology        Topology
	MemoryBytes     uint64
	Multiprocessors int
	// MIGCapable is true when the GPU supports MIG at all.
	MIGCapable bool
	// MIGEnabled is the current MIG mode.
	MIGEnabled bool
	// MIGProfiles lists the GPU instance profiles, only when MIG is enabled.
	MIGProfiles []MIGProfile
	// MIGInstances lists the MIG devices that exist now.
	MIGInstances []MIGInstance
}

// Topology places a GPU among the node's PCIe root complexes and NUMA
// nodes, for the standard attributes resource.kubernetes.io/pcieRoot and
// numaNode that other drivers' devices (NICs) publish too.
type Topology struct {
	// PCIeRoot is the root complex, e.g. "pci0000:00"; "" when unknown.
	PCIeRoot string
	// NUMANode is the GPU's NUMA node when HasNUMANode (sysfs reports -1
	// for a device with no NUMA affinity, as in many VMs).
	NUMANode    int
	HasNUMANode bool
}

// Placement is a GPU instance placement in memory slices.
type Placement struct {
	Start int
	Size  int
}

// MIGProfile is a GPU instance profile with its compute instance profile
// for a full-size compute instance.
type MIGProfile struct {
	// Name as nvidia-smi prints it, e.g. "1g.10gb" or "1g.10gb+me".
	Name            string
	GIProfileID     int
	CIProfileID     int
	MemoryBytes     uint64
	SliceCount      int
	Multiprocessors int
	CopyEngines     int
	Decoders        int
	Encoders        int
	JPEGs           int
	OFAs            int
	InstanceCount   int
	Placements      []Placement
}

// MIGInstance is a MIG device that exists on the GPU.
type MIGInstance struct {
	UUID        string
	Profile     string
	GIProfileID int
	GIID        int
	CIID        int
	Placement   Placement
}

// CoresPerSM is the number of CUDA cores per streaming multiprocessor for
// a compute capability, 0 when unknown: 64 for Volta, Turing and GA100
// (7.x, 8.0), 128 from GA10x on (8.6, 8.7, 8.9, Hopper 9.0, Blackwell 10.x
// and 12.x).
func CoresPerSM(major, minor int) int {
	switch {
	case major == 7, major == 8 && minor == 0:
		return 64
	case major == 8, major == 9, major == 10, major == 12:
		return 128
	}
	return 0
}
