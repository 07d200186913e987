// Package devicemodel turns a discovered inventory and the node
// configuration into the devices, capacities and counters Tessera publishes.
//
// One pool per node. Per GPU, by its state:
//   - MIG disabled: gpu-<i>, allowMultipleAllocations, consumable `memory`
//     (bytes, net of the reserve) and `cores` (percent). A request without
//     capacity takes all memory (exclusive); one with capacity.requests.memory
//     gets a share of that size. With a share cap (--max-shares-per-gpu=N)
//     also consumable `shares` = N, default 1: every allocation of the GPU
//     (share or exclusive) takes one, so the scheduler places at most N.
//   - Time slices (N > 0): also gpu-<i>-ts-<k>, k < N, each with usable/N
//     memory. A counter set per GPU makes the scheduler place up to N
//     partitions together but never a partition next to a share or whole-GPU
//     allocation of gpu-<i>.
//   - MIG enabled: dynamic mode publishes every profile x placement with
//     counters over the GPU's memory slices, compute slices, per-profile
//     instance limits and media engines, so every combination the scheduler
//     picks can be created; static mode publishes the instances that exist.
package devicemodel

import (
	"fmt"
	"sort"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
)

// Attribute and capacity names (qualified by the driver name in CEL:
// device.attributes["gpu.tessera.dev"].type).
const (
	AttrType            = "type"
	AttrUUID            = "uuid"
	AttrIndex           = "index"
	AttrProductName     = "productName"
	AttrArchitecture    = "architecture"
	AttrBrand           = "brand"
	AttrCUDACompute     = "cudaComputeCapability"
	AttrDriverVersion   = "driverVersion"
	AttrCUDADriver      = "cudaDriverVersion"
	AttrMIGProfile      = "migProfile"
	AttrParentUUID      = "parentUUID"
	AttrPlacementStart  = "migPlacementStart"
	AttrTimeSlices      = "timeSlices"
	AttrMultiprocessors = "multiprocessors"
	AttrPCIBusID        = "resource.kubernetes.io/pciBusID"
	AttrPCIeRoot        = "resource.kubernetes.io/pcieRoot"
	AttrNUMANode        = "resource.kubernetes.io/numaNode"
	CapMemory           = "memory"
	CapCores            = "cores"
	CapShares           = "shares"
	CapMultiprocessors  = "multiprocessors"
	CapCopyEngines      = "copyEngines"
	CapDecoders         = "decoders"
	CapEncoders         = "encoders"
	CapJPEGs            = "jpegEngines"
	CapOFAs             = "ofaEngines"
	counterMemory       = "memory"
	counterComputeSlice = "compute-slices"
	counterOFA          = "ofa-engines"
)

// Limits from resource.k8s.io/v1 validation.
const (
	maxDevicesPerSlice         = resourceapi.ResourceSliceMaxDevices
	maxDevicesPerSliceAdvanced = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
	maxCounterSetsPerSlice     = resourceapi.ResourceSliceMaxCounterSets
	maxCountersPerSet          = resourceapi.ResourceSliceMaxCountersPerCounterSet
)

// UsableMemory is the memory a GPU offers to claims: total minus reserve.
func UsableMemory(gpu inventory.GPU, reserved uint64) (uint64, error) {
	if reserved >= gpu.MemoryBytes {
		return 0, fmt.Errorf("--reserved-memory=%s is not smaller than GPU %d's memory (%s, %s): lower it",
			quantity(reserved), gpu.Index, quantity(gpu.MemoryBytes), gpu.ProductName)
	}
	usable := gpu.MemoryBytes - reserved
	return usable - usable%ShareMemoryStep, nil
}

// TimeSliceMemory is the memory of one of n time-slice partitions.
func TimeSliceMemory(usable uint64, n int) uint64 {
	m := usable / uint64(n)
	return m - m%ShareMemoryStep
}

// gpuDevices is what one GPU contributes to the pool.
type gpuDevices struct {
	devices    []resourceapi.Device
	counterSet *resourceapi.CounterSet
}

// Build returns the slices of the node's pool, split to respect the API
// limits, devices ordered so that first fit packs.
func Build(inv *inventory.Inventory, cfg Config) ([]resourceslice.Slice, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var perGPU []gpuDevices
	for _, gpu := range inv.GPUs {
		if _, ok := cfg.Excluded[gpu.UUID]; ok {
			continue
		}
		var (
			g   gpuDevices
			err error
		)
		switch {
		case gpu.MIGEnabled && cfg.MIGMode == MIGDynamic:
			g, err = dynamicMIGDevices(inv, gpu, ForeignMIGInstances(gpu, cfg.ForeignMIG))
		case gpu.MIGEnabled:
			g = staticMIGDevices(inv, gpu)
		default:
			g, err = fullGPUDevices(inv, gpu, cfg)
		}
		if err != nil {
			return nil, err
		}
		for i := range g.devices {
			g.devices[i].Taints = append(g.devices[i].Taints, cfg.Taints[g.devices[i].Name]...)
		}
		perGPU = append(perGPU, g)
	}
	return split(perGPU), nil
}

func commonAttributes(inv *inventory.Inventory, gpu inventory.GPU, typ string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		AttrType:         {StringValue: ptr.To(typ)},
		AttrUUID:         {StringValue: ptr.To(gpu.UUID)},
		AttrIndex:        {IntValue: ptr.To(int64(gpu.Index))},
		AttrProductName:  {StringValue: ptr.To(gpu.ProductName)},
		AttrArchitecture: {StringValue: ptr.To(gpu.Architecture)},
		AttrBrand:        {StringValue: ptr.To(gpu.Brand)},
	}
	if v := semver(gpu.CUDAComputeCap); v != "" {
		attrs[AttrCUDACompute] = resourceapi.DeviceAttribute{VersionValue: ptr.To(v)}
	}
	if v := semver(inv.DriverVersion); v != "" {
		attrs[AttrDriverVersion] = resourceapi.DeviceAttribute{VersionValue: ptr.To(v)}
	}
	if v := semver(inv.CUDADriverVersion); v != "" {
		attrs[AttrCUDADriver] = resourceapi.DeviceAttribute{VersionValue: ptr.To(v)}
	}
	if gpu.PCIBusID != "" {
		attrs[AttrPCIBusID] = resourceapi.DeviceAttribute{StringValue: ptr.To(gpu.PCIBusID)}
	}
	// Every device of the GPU (whole, share, time slice, MIG) sits where
	// the GPU sits: a claim can align any of them with another driver's
	// device (a NIC) by matchAttribute.
	if gpu.Topology.PCIeRoot != "" {
		attrs[AttrPCIeRoot] = resourceapi.DeviceAttribute{StringValue: ptr.To(gpu.Topology.PCIeRoot)}
	}
	if gpu.Topology.HasNUMANode {
		attrs[AttrNUMANode] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(gpu.Topology.NUMANode))}
	}
	return attrs
}

func fullGPUDevices(inv *inventory.Inventory, gpu inventory.GPU, cfg Config) (gpuDevices, error) {
	usable, err := UsableMemory(gpu, cfg.ReservedMemory)
	if err != nil {
		return gpuDevices{}, err
	}
	if usable < MinShareMemory {
		return gpuDevices{}, fmt.Errorf("--reserved-memory=%s leaves GPU %d only %s, less than the smallest share (%s): lower it",
			quantity(cfg.ReservedMemory), gpu.Index, quantity(usable), quantity(MinShareMemory))
	}
	memQ := *resource.NewQuantity(int64(usable), resource.BinarySI)
	whole := resourceapi.Device{
		Name:                     GPUDeviceName(gpu.Index),
		AllowMultipleAllocations: ptr.To(true),
		Attributes:               commonAttributes(inv, gpu, TypeGPU),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			CapMemory: {
				Value: memQ,
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default: ptr.To(memQ),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{
						Min:  resource.NewQuantity(MinShareMemory, resource.BinarySI),
						Max:  ptr.To(memQ),
						Step: resource.NewQuantity(ShareMemoryStep, resource.BinarySI),
					},
				},
			},
			// A request without cores consumes the fixed default 0: the
			// allocator cannot make it proportional to memory. The plugin
			// caps such a share by its class's computeDefault at prepare
			// (enforce.ComputeCap); docs/enforcement.md, "Compute default".
			CapCores: {
				Value: resource.MustParse("100"),
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default: resource.NewQuantity(0, resource.DecimalSI),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{
						Min:  resource.NewQuantity(0, resource.DecimalSI),
						Max:  resource.NewQuantity(100, resource.DecimalSI),
						Step: resource.NewQuantity(1, resource.DecimalSI),
					},
				},
			},
		},
	}
	if n := cfg.MaxSharesPerGPU; n > 0 {
		// One share per allocation unless the claim asks for more
		// (capacity.requests.shares, up to N); a request of 0 is rounded up
		// to 1 by the allocator, so no claim slips past the cap.
		whole.Capacity[CapShares] = resourceapi.DeviceCapacity{
			Value: *resource.NewQuantity(int64(n), resource.DecimalSI),
			RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default: resource.NewQuantity(1, resource.DecimalSI),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{
					Min:  resource.NewQuantity(1, resource.DecimalSI),
					Max:  resource.NewQuantity(int64(n), resource.DecimalSI),
					Step: resource.NewQuantity(1, resource.DecimalSI),
				},
			},
		}
	}
	// Every capacity of a shareable device is consumed by each share (its
	// default when not requested), so the SM count is an attribute here.
	// Left out when discovery could not tell (never published as 0).
	if gpu.Multiprocessors > 0 {
		whole.Attributes[AttrMultiprocessors] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(gpu.Multiprocessors))}
	}
	out := gpuDevices{devices: []resourceapi.Device{whole}}
	n := cfg.timeSlicesFor(gpu.Index, gpu.UUID)
	if n == 0 {
		return out, nil
	}
	tsMem := TimeSliceMemory(usable, n)
	set := CounterSetName(gpu.Index)
	out.counterSet = &resourceapi.CounterSet{
		Name:     set,
		Counters: map[string]resourceapi.Counter{counterMemory: {Value: memQ}},
	}
	// The whole-GPU device consumes every counter once, however many
	// shares it carries; a time slice consumes its part.
	out.devices[0].ConsumesCounters = []resourceapi.DeviceCounterConsumption{{
		CounterSet: set,
		Counters:   map[string]resourceapi.Counter{counterMemory: {Value: memQ}},
	}}
	tsMemQ := *resource.NewQuantity(int64(tsMem), resource.BinarySI)
	for k := range n {
		attrs := commonAttributes(inv, gpu, TypeTimeSlice)
		attrs[AttrTimeSlices] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(n))}
		out.devices = append(out.devices, resourceapi.Device{
			Name:       TimeSliceDeviceName(gpu.Index, k),
			Attributes: attrs,
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				CapMemory: {Value: tsMemQ},
			},
			ConsumesCounters: []resourceapi.DeviceCounterConsumption{{
				CounterSet: set,
				Counters:   map[string]resourceapi.Counter{counterMemory: {Value: tsMemQ}},
			}},
		})
	}
	return out, nil
}

func migCapacity(p inventory.MIGProfile) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	q := func(n int) resourceapi.DeviceCapacity {
		return resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(n), resource.DecimalSI)}
	}
	return map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		CapMemory:          {Value: *resource.NewQuantity(int64(p.MemoryBytes), resource.BinarySI)},
		CapMultiprocessors: q(p.Multiprocessors),
		CapCopyEngines:     q(p.CopyEngines),
		CapDecoders:        q(p.Decoders),
		CapEncoders:        q(p.Encoders),
		CapJPEGs:           q(p.JPEGs),
		CapOFAs:            q(p.OFAs),
	}
}

func migAttributes(inv *inventory.Inventory, gpu inventory.GPU, profile string, start int, uuid string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := commonAttributes(inv, gpu, TypeMIG)
	attrs[AttrMIGProfile] = resourceapi.DeviceAttribute{StringValue: ptr.To(profile)}
	attrs[AttrParentUUID] = resourceapi.DeviceAttribute{StringValue: ptr.To(gpu.UUID)}
	attrs[AttrPlacementStart] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(start))}
	if uuid != "" {
		attrs[AttrUUID] = resourceapi.DeviceAttribute{StringValue: ptr.To(uuid)}
	}
	return attrs
}

func memorySliceCounter(j int) string { return fmt.Sprintf("memory-slice-%d", j) }

func profileInstancesCounter(p inventory.MIGProfile) string {
	return "instances-" + ProfileToken(p.Name)
}

// ForeignMIGInstances returns the MIG instances on gpu that foreign says
// the plugin did not create.
func ForeignMIGInstances(gpu inventory.GPU, foreign func(string, inventory.MIGInstance) bool) []inventory.MIGInstance {
	if foreign == nil {
		return nil
	}
	var out []inventory.MIGInstance
	for _, inst := range gpu.MIGInstances {
		if foreign(gpu.UUID, inst) {
			out = append(out, inst)
		}
	}
	return out
}

func overlaps(a, b inventory.Placement) bool {
	return a.Start < b.Start+b.Size && b.Start < a.Start+a.Size
}

// dynamicMIGDevices publishes every profile x placement. The counters
// encode NVML's placement rules: a placement consumes the memory slices it
// covers, its compute slices, its OFA engines, and one instance of its
// profile where the profile allows fewer instances than it has placements.
// Foreign instances (not created by the plugin) are taken off first: the
// placements they overlap are not published, and the compute slices, OFA
// engines and profile instances they use are subtracted from the counters.
func dynamicMIGDevices(inv *inventory.Inventory, gpu inventory.GPU, foreign []inventory.MIGInstance) (gpuDevices, error) {
	set := CounterSetName(gpu.Index)
	one := resource.MustParse("1")
	counters := map[string]resourceapi.Counter{}
	memSlices, computeSlices, ofas := 0, 0, 0
	for _, p := range gpu.MIGProfiles {
		for _, pl := range p.Placements {
			memSlices = max(memSlices, pl.Start+pl.Size)
		}
		computeSlices = max(computeSlices, p.SliceCount)
		ofas = max(ofas, p.OFAs)
	}
	for j := range memSlices {
		counters[memorySliceCounter(j)] = resourceapi.Counter{Value: one}
	}
	counters[counterComputeSlice] = resourceapi.Counter{Value: *resource.NewQuantity(int64(computeSlices), resource.DecimalSI)}
	if ofas > 0 {
		counters[counterOFA] = resourceapi.Counter{Value: *resource.NewQuantity(int64(ofas), resource.DecimalSI)}
	}
	for _, p := range gpu.MIGProfiles {
		if p.InstanceCount < len(p.Placements) {
			counters[profileInstancesCounter(p)] = resourceapi.Counter{Value: *resource.NewQuantity(int64(p.InstanceCount), resource.DecimalSI)}
		}
	}
	for _, inst := range foreign {
		for _, p := range gpu.MIGProfiles {
			if p.GIProfileID != inst.GIProfileID {
				continue
			}
			subtract(counters, counterComputeSlice, p.SliceCount)
			subtract(counters, counterOFA, p.OFAs)
			subtract(counters, profileInstancesCounter(p), 1)
		}
	}
	if len(counters) > maxCountersPerSet {
		return gpuDevices{}, fmt.Errorf("GPU %d: MIG needs %d counters, more than the %d a counter set may hold", gpu.Index, len(counters), maxCountersPerSet)
	}
	out := gpuDevices{counterSet: &resourceapi.CounterSet{Name: set, Counters: counters}}
	// Larger profiles first; within a profile, the highest placement first,
	// so that small instances fill the end of the GPU and leave the aligned
	// low placements that large profiles need.
	profiles := append([]inventory.MIGProfile(nil), gpu.MIGProfiles...)
	sort.SliceStable(profiles, func(i, j int) bool { return profiles[i].MemoryBytes > profiles[j].MemoryBytes })
	for _, p := range profiles {
	placements:
		for i := len(p.Placements) - 1; i >= 0; i-- {
			pl := p.Placements[i]
			for _, inst := range foreign {
				if overlaps(pl, inst.Placement) {
					continue placements
				}
			}
			consumed := map[string]resourceapi.Counter{
				counterComputeSlice: {Value: *resource.NewQuantity(int64(p.SliceCount), resource.DecimalSI)},
			}
			for j := pl.Start; j < pl.Start+pl.Size; j++ {
				consumed[memorySliceCounter(j)] = resourceapi.Counter{Value: one}
			}
			if p.OFAs > 0 {
				consumed[counterOFA] = resourceapi.Counter{Value: *resource.NewQuantity(int64(p.OFAs), resource.DecimalSI)}
			}
			if _, ok := counters[profileInstancesCounter(p)]; ok {
				consumed[profileInstancesCounter(p)] = resourceapi.Counter{Value: one}
			}
			out.devices = append(out.devices, resourceapi.Device{
				Name:             MIGDeviceName(gpu.Index, p.Name, pl.Start),
				Attributes:       migAttributes(inv, gpu, p.Name, pl.Start, ""),
				Capacity:         migCapacity(p),
				ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: set, Counters: consumed}},
			})
		}
	}
	return out, nil
}

// subtract lowers a counter by n, not below zero; absent counters stay absent.
func subtract(counters map[string]resourceapi.Counter, name string, n int) {
	c, ok := counters[name]
	if !ok || n == 0 {
		return
	}
	v := max(c.Value.Value()-int64(n), 0)
	counters[name] = resourceapi.Counter{Value: *resource.NewQuantity(v, resource.DecimalSI)}
}

// staticMIGDevices publishes the MIG instances that exist.
func staticMIGDevices(inv *inventory.Inventory, gpu inventory.GPU) gpuDevices {
	var out gpuDevices
	for _, inst := range gpu.MIGInstances {
		var profile inventory.MIGProfile
		for _, p := range gpu.MIGProfiles {
			if p.GIProfileID == inst.GIProfileID {
				profile = p
			}
		}
		out.devices = append(out.devices, resourceapi.Device{
			Name:       MIGDeviceName(gpu.Index, inst.Profile, inst.Placement.Start),
			Attributes: migAttributes(inv, gpu, inst.Profile, inst.Placement.Start, inst.UUID),
			Capacity:   migCapacity(profile),
		})
	}
	return out
}

// split packs counter sets and devices into slices within the API limits.
// Counter sets go first (a slice holds devices or counters, never both);
// devices keep their order and a GPU's devices stay in one slice when they fit.
func split(perGPU []gpuDevices) []resourceslice.Slice {
	var (
		slices  []resourceslice.Slice
		sets    []resourceapi.CounterSet
		limit   = maxDevicesPerSlice
		current []resourceapi.Device
	)
	for _, g := range perGPU {
		if g.counterSet != nil {
			sets = append(sets, *g.counterSet)
		}
		for _, d := range g.devices {
			if len(d.ConsumesCounters) > 0 || len(d.Taints) > 0 {
				limit = maxDevicesPerSliceAdvanced
			}
		}
	}
	for len(sets) > 0 {
		n := min(len(sets), maxCounterSetsPerSlice)
		slices = append(slices, resourceslice.Slice{SharedCounters: sets[:n]})
		sets = sets[n:]
	}
	for _, g := range perGPU {
		if len(current)+len(g.devices) > limit && len(current) > 0 {
			slices = append(slices, resourceslice.Slice{Devices: current})
			current = nil
		}
		for _, d := range g.devices {
			if len(current) == limit {
				slices = append(slices, resourceslice.Slice{Devices: current})
				current = nil
			}
			current = append(current, d)
		}
	}
	if len(current) > 0 || len(slices) == 0 {
		slices = append(slices, resourceslice.Slice{Devices: current})
	}
	return slices
}

// semver makes "9.0" or "580.95.05" a valid semantic version ("9.0.0",
// "580.95.5"); it returns "" for input it cannot read.
func semver(v string) string {
	var a, b, c int
	n, _ := fmt.Sscanf(v, "%d.%d.%d", &a, &b, &c)
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%d.%d.%d", a, b, c)
}

func quantity(b uint64) string {
	return resource.NewQuantity(int64(b), resource.BinarySI).String()
}
