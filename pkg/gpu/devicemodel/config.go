package devicemodel

import (
	"fmt"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
)

// MIGMode says how MIG-enabled GPUs are published.
type MIGMode string

const (
	// MIGDynamic publishes every profile x placement; instances are created
	// at prepare and destroyed at unprepare.
	MIGDynamic MIGMode = "dynamic"
	// MIGStatic publishes the MIG instances that already exist.
	MIGStatic MIGMode = "static"
)

// Limits of the node configuration.
const (
	MaxTimeSlices = 32
	// MaxSharesPerGPU bounds --max-shares-per-gpu (far above what any GPU
	// shares usefully; it only keeps the published quantity sane).
	MaxSharesPerGPU = 1024
	// DefaultReservedMemory is held back on every GPU for the driver and
	// CUDA contexts; shares are carved from the rest.
	DefaultReservedMemory = 256 << 20
	// MinShareMemory is the smallest memory share; smaller requests are
	// rounded up to it by the scheduler.
	MinShareMemory = 256 << 20
	// ShareMemoryStep is the granularity of memory shares (the interposer
	// enforces limits in MiB).
	ShareMemoryStep = 1 << 20
)

// Config is the node configuration that shapes the published devices.
type Config struct {
	// ReservedMemory is subtracted from every GPU's memory before shares and
	// time slices are carved from it.
	ReservedMemory uint64
	// TimeSlices is the number of time-slice partitions per GPU (0 = none).
	TimeSlices int
	// TimeSlicesPerGPU overrides TimeSlices for GPUs by index or UUID.
	TimeSlicesPerGPU map[string]int
	// MaxSharesPerGPU caps the allocations of one non-MIG GPU (shares and
	// exclusive claims alike), published as the consumable capacity
	// `shares` so that the scheduler enforces it; 0 = no cap.
	MaxSharesPerGPU int
	MIGMode         MIGMode
	// Taints are added to devices by name (health).
	Taints map[string][]resourceapi.DeviceTaint
	// ForeignMIG says whether a MIG instance that exists on a dynamically
	// partitioned GPU was not created by this plugin (no record owns it).
	// Placements such an instance blocks are left out of the slices and
	// the counters are reduced by what it uses, so that the scheduler never
	// allocates a placement prepare cannot create. Nil: no instance is
	// foreign (the inventory has none, or they are all the plugin's).
	ForeignMIG func(gpuUUID string, inst inventory.MIGInstance) bool
	// Excluded GPUs (by UUID, with the reason) are not published at all:
	// something else on the node already hands them out (pkg/node/coexist).
	Excluded map[string]string
}

// DefaultConfig is the configuration the kubelet plugin runs with when no
// flag changes it (pkg/node/plugin checks that its defaults say so): the
// default reserve, no time slices, no share cap, dynamic MIG.
func DefaultConfig() Config {
	return Config{ReservedMemory: DefaultReservedMemory, MIGMode: MIGDynamic}
}

// Validate checks the configuration; messages name the flag to fix.
func (c Config) Validate() error {
	if c.TimeSlices < 0 || c.TimeSlices > MaxTimeSlices {
		return fmt.Errorf("--time-slices=%d is out of range: use 0 (no time slices) to %d", c.TimeSlices, MaxTimeSlices)
	}
	for gpu, n := range c.TimeSlicesPerGPU {
		if n < 0 || n > MaxTimeSlices {
			return fmt.Errorf("time slices for GPU %s = %d is out of range: use 0 to %d", gpu, n, MaxTimeSlices)
		}
	}
	if c.MaxSharesPerGPU < 0 || c.MaxSharesPerGPU > MaxSharesPerGPU {
		return fmt.Errorf("--max-shares-per-gpu=%d is out of range: use 0 (no cap) to %d", c.MaxSharesPerGPU, MaxSharesPerGPU)
	}
	switch c.MIGMode {
	case MIGDynamic, MIGStatic:
	default:
		return fmt.Errorf("--mig-mode=%q is not valid: use dynamic or static", c.MIGMode)
	}
	return nil
}

// timeSlicesFor returns N for one GPU.
func (c Config) timeSlicesFor(index int, uuid string) int {
	if n, ok := c.TimeSlicesPerGPU[uuid]; ok {
		return n
	}
	if n, ok := c.TimeSlicesPerGPU[strconv.Itoa(index)]; ok {
		return n
	}
	return c.TimeSlices
}
