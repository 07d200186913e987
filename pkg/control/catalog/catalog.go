// Package catalog indexes the devices gpu.tessera.dev publishes (and which
// DeviceClasses are Tessera's) and turns claims on them into charges in the
// accounted resources
// (gpu.tessera.dev/memory in bytes, gpu.tessera.dev/gpus in GPU
// equivalents): estimates for claims not yet allocated, the real charge
// from allocation results (consumed capacity, the device's memory) for
// claims the scheduler allocated.
package catalog

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unique"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/queue"
	"github.com/tessera-dev/tessera/pkg/control/sliceintern"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

// DefaultMIGComputeSlices is the number of compute slices of a MIG-capable
// GPU (A100, H100, H200, B200) used when a MIG device's slices are not
// published as counters (static MIG mode).
const DefaultMIGComputeSlices = 7

// Device is a published gpu.tessera.dev device with what accounting needs.
type Device struct {
	Node   string
	Pool   string
	Name   string
	Type   string
	Memory int64
	// GPUs is what one allocation of the whole device charges (micro-GPUs):
	// 1 GPU for a GPU, 1/N for a time slice, the compute fraction for MIG.
	GPUs int64
	// Physical identifies the physical GPU (pool and UUID).
	Physical string
	// Shareable is set for devices allocated in memory shares.
	Shareable bool
	// MinShare and ShareStep round a share's memory as the request policy does.
	MinShare, ShareStep int64
	// What CEL sees of the device (celDevice).
	attrs      sliceintern.Attrs
	allowMulti *bool
	capacity   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity
}

// celDevice is the device as CEL selectors see it (its attributes in the
// API's form, made for the call when the cache keeps them compact).
func (d *Device) celDevice(driver string) cel.Device {
	return cel.Device{Driver: driver, AllowMultipleAllocations: d.allowMulti, Attributes: d.attrs.Map(), Capacity: d.capacity}
}

// Catalog indexes the published devices of the driver, the device classes
// and the cluster's capacity.
type Catalog struct {
	Driver   string
	devices  map[deviceKey]*Device
	shapes   []*Device // one device per distinct shape, for estimates
	perNode  map[string][]*Device
	classes  map[string]*resourceapi.DeviceClass
	capacity queue.Vector
	cache    *cel.Cache
	// results remembers what each selector said about each device: the
	// same claims are estimated many times in a cycle.
	mu      sync.Mutex
	results map[selectorOnDevice]bool
	// ours remembers IsOurClass per class object.
	ours map[*resourceapi.DeviceClass]bool
}

// deviceKey names a device by pool and name (the slice's strings, not a
// string made per device).
type deviceKey struct{ pool, name string }

type selectorOnDevice struct {
	device *Device
	expr   string
}

// NewCatalog indexes the slices (only the newest generation of each pool
// counts) and classes. The CEL cache may be shared with the allocator.
// attrs reads the devices' attributes (nil: the slices carry them, not
// in the controller cache's compact form).
func NewCatalog(slices []*resourceapi.ResourceSlice, classes []*resourceapi.DeviceClass, cache *cel.Cache, attrs *sliceintern.Interner) *Catalog {
	c := &Catalog{
		Driver:  devicemodel.DriverName,
		devices: map[deviceKey]*Device{},
		perNode: map[string][]*Device{},
		classes: map[string]*resourceapi.DeviceClass{},
		cache:   cache,
	}
	for _, dc := range classes {
		c.classes[dc.Name] = dc
	}
	newest := map[string]int64{}
	for _, s := range slices {
		if s.Spec.Driver == c.Driver {
			newest[s.Spec.Pool.Name] = max(newest[s.Spec.Pool.Name], s.Spec.Pool.Generation)
		}
	}
	// Compute slices per counter set, per pool, for MIG fractions.
	computeSlices := map[string]int64{}
	for _, s := range slices {
		if s.Spec.Driver != c.Driver || s.Spec.Pool.Generation != newest[s.Spec.Pool.Name] {
			continue
		}
		for _, cs := range s.Spec.SharedCounters {
			if v, ok := cs.Counters["compute-slices"]; ok {
				computeSlices[s.Spec.Pool.Name+"/"+cs.Name] = satValue(v.Value)
			}
		}
	}
	physMem := map[string]int64{}
	physNode := map[string]string{}
	shapeKeys := map[string]bool{}
	for _, s := range slices {
		if s.Spec.Driver != c.Driver || s.Spec.Pool.Generation != newest[s.Spec.Pool.Name] {
			continue
		}
		node := ptr.Deref(s.Spec.NodeName, "")
		for i := range s.Spec.Devices {
			d := c.device(node, s.Spec.Pool.Name, &s.Spec.Devices[i], attrs.Attributes(s, i), computeSlices)
			c.devices[deviceKey{d.Pool, d.Name}] = d
			c.perNode[node] = append(c.perNode[node], d)
			if d.Physical != "" {
				mem := d.Memory
				if d.Type == devicemodel.TypeTimeSlice {
					mem = 0 // the GPU device of the same UUID carries it
				}
				physMem[d.Physical] = max(physMem[d.Physical], mem)
				physNode[d.Physical] = node
			}
			key := shapeKey(d)
			if !shapeKeys[key] {
				shapeKeys[key] = true
				c.shapes = append(c.shapes, d)
			}
		}
	}
	for _, m := range physMem {
		c.capacity = c.capacity.Add(queue.Vector{queue.Memory: m, queue.GPUs: queue.GPU})
	}
	sort.Slice(c.shapes, func(i, j int) bool { return shapeKey(c.shapes[i]) < shapeKey(c.shapes[j]) })
	return c
}

func shapeKey(d *Device) string {
	attr := func(n string) string {
		a, _ := d.attrs.Get(resourceapi.QualifiedName(n))
		switch {
		case a.StringValue != nil:
			return *a.StringValue
		case a.IntValue != nil:
			return strconv.FormatInt(*a.IntValue, 10)
		case a.VersionValue != nil:
			return *a.VersionValue
		}
		return ""
	}
	return strings.Join([]string{d.Type, attr(devicemodel.AttrProductName), attr(devicemodel.AttrMIGProfile),
		attr(devicemodel.AttrTimeSlices), strconv.FormatInt(d.Memory, 10), strconv.FormatInt(d.GPUs, 10)}, "|")
}

func (c *Catalog) device(node, pool string, d *resourceapi.Device, attrs sliceintern.Attrs, computeSlices map[string]int64) *Device {
	out := &Device{
		Node: node, Pool: pool, Name: d.Name,
		attrs: attrs, allowMulti: d.AllowMultipleAllocations, capacity: d.Capacity,
	}
	if a, _ := attrs.Get(devicemodel.AttrType); a.StringValue != nil {
		out.Type = *a.StringValue
	}
	if mem, ok := d.Capacity[devicemodel.CapMemory]; ok {
		out.Memory = max(satValue(mem.Value), 0)
		if p := mem.RequestPolicy; p != nil && p.ValidRange != nil {
			out.Shareable = ptr.Deref(d.AllowMultipleAllocations, false)
			if p.ValidRange.Min != nil {
				out.MinShare = max(satValue(*p.ValidRange.Min), 0)
			}
			if p.ValidRange.Step != nil {
				out.ShareStep = max(satValue(*p.ValidRange.Step), 0)
			}
		}
	}
	uuid, _ := attrs.Get(devicemodel.AttrUUID)
	parent, _ := attrs.Get(devicemodel.AttrParentUUID)
	// One string per GPU, shared by its MIG devices, shares and slices.
	switch {
	case parent.StringValue != nil:
		out.Physical = unique.Make(pool + "/" + *parent.StringValue).Value()
	case uuid.StringValue != nil:
		out.Physical = unique.Make(pool + "/" + *uuid.StringValue).Value()
	}
	switch out.Type {
	case devicemodel.TypeTimeSlice:
		n := int64(1)
		if a, _ := attrs.Get(devicemodel.AttrTimeSlices); a.IntValue != nil && *a.IntValue > 0 {
			n = *a.IntValue
		}
		out.GPUs = queue.GPU / n
	case devicemodel.TypeMIG:
		out.GPUs = migFraction(pool, d, attrs, computeSlices)
	default:
		out.GPUs = queue.GPU
	}
	return out
}

// migFraction is the MIG device's compute slices over the GPU's: from the
// counters in dynamic mode, from the profile name ("3g.40gb" = 3 of 7)
// otherwise.
func migFraction(pool string, d *resourceapi.Device, attrs sliceintern.Attrs, computeSlices map[string]int64) int64 {
	for _, cc := range d.ConsumesCounters {
		if used, ok := cc.Counters["compute-slices"]; ok {
			if total := computeSlices[pool+"/"+cc.CounterSet]; total > 0 {
				return min(mulDiv(satValue(used.Value), queue.GPU, total), queue.GPU)
			}
		}
	}
	if a, _ := attrs.Get(devicemodel.AttrMIGProfile); a.StringValue != nil {
		g, _, ok := strings.Cut(*a.StringValue, "g.")
		if n, err := strconv.Atoi(g); ok && err == nil && n > 0 && n <= DefaultMIGComputeSlices {
			return int64(n) * queue.GPU / DefaultMIGComputeSlices
		}
	}
	return queue.GPU
}

// Capacity is the cluster's total: usable memory and GPUs of every
// published physical GPU.
func (c *Catalog) Capacity() queue.Vector { return c.capacity }

// Lookup returns the device published as pool/name.
func (c *Catalog) Lookup(pool, name string) *Device { return c.devices[deviceKey{pool, name}] }

// NodeDevices returns the devices published for a node.
func (c *Catalog) NodeDevices(node string) []*Device { return c.perNode[node] }

// IsOurClass says whether a device class selects devices of this driver,
// by evaluating its selectors, not by reading their text: by
// ClassSelectsDriver when the selectors decide on the driver, else by
// whether they select a device the driver publishes.
func (c *Catalog) IsOurClass(ctx context.Context, dc *resourceapi.DeviceClass) bool {
	c.mu.Lock()
	ours, known := c.ours[dc]
	c.mu.Unlock()
	if known {
		return ours
	}
	ours = c.isOurClass(ctx, dc)
	c.mu.Lock()
	if c.ours == nil {
		c.ours = map[*resourceapi.DeviceClass]bool{}
	}
	c.ours[dc] = ours
	c.mu.Unlock()
	return ours
}

func (c *Catalog) isOurClass(ctx context.Context, dc *resourceapi.DeviceClass) bool {
	if selects, decided := ClassSelectsDriver(ctx, c.cache, dc, c.Driver); decided {
		return selects
	}
	for _, d := range c.shapes {
		if ok, err := evalSelectors(ctx, c.cache, d.celDevice(c.Driver), dc.Spec.Selectors); ok && err == nil {
			return true
		}
	}
	return false
}

// ClassSelectsDriver evaluates a device class's CEL selectors on a device
// that carries only the driver's name and on one that carries another's.
// When the two differ, the selectors decide on the driver (decided), and
// they select the driver's devices unless they reject the first (an error
// there means they went on to the driver's attributes). The text does not
// count: `device.driver != "gpu.tessera.dev"` names the driver and selects
// none of its devices. A class without a driver check is not decided.
func ClassSelectsDriver(ctx context.Context, cache *cel.Cache, dc *resourceapi.DeviceClass, driver string) (selects, decided bool) {
	ours, errOurs := evalSelectors(ctx, cache, cel.Device{Driver: driver}, dc.Spec.Selectors)
	other, errOther := evalSelectors(ctx, cache, cel.Device{Driver: "other.driver.invalid"}, dc.Spec.Selectors)
	if (errOurs != nil) == (errOther != nil) && ours == other {
		return false, false
	}
	return ours || errOurs != nil, true
}

// shareCharge is what a share of mem bytes of device d charges.
func (d *Device) shareCharge(mem int64) queue.Vector {
	if d.Memory <= 0 {
		return queue.Vector{queue.Memory: mem}
	}
	mem = min(mem, d.Memory)
	return queue.Vector{queue.Memory: mem, queue.GPUs: mulDiv(mem, d.GPUs, d.Memory)}
}

// wholeCharge is what the whole device charges.
func (d *Device) wholeCharge() queue.Vector {
	return queue.Vector{queue.Memory: d.Memory, queue.GPUs: d.GPUs}
}

// roundShare rounds a requested share up as the capacity request policy
// does.
func (d *Device) roundShare(mem int64) int64 {
	if d.ShareStep > 0 && mem%d.ShareStep != 0 {
		mem = satAdd(mem, d.ShareStep-mem%d.ShareStep)
	}
	return max(mem, d.MinShare)
}

// mulDiv returns a*b/c for a, b >= 0 and c > 0 without overflow of the
// product, saturating at MaxInt64; 0 when c <= 0 or a or b is negative.
func mulDiv(a, b, c int64) int64 {
	if c <= 0 || a < 0 || b < 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(min(q, math.MaxInt64))
}

// satAdd returns a+b for a, b >= 0, saturating at MaxInt64.
func satAdd(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}

// satValue is a quantity in units, rounded up, saturating at the int64
// bounds (Quantity.Value wraps beyond them).
func satValue(q resource.Quantity) int64 {
	return queue.FromQuantity(queue.Memory, q)
}

// ChargeResult is the real charge of one allocated device: the consumed
// memory of a share, the whole device otherwise. Other drivers' devices
// charge nothing; devices taken with adminAccess are charged like any
// others (free, they were a way around every queue). A device no longer
// published is charged by its name where possible (a whole GPU as 1 GPU).
func (c *Catalog) ChargeResult(r *resourceapi.DeviceRequestAllocationResult) queue.Vector {
	if r.Driver != c.Driver {
		return queue.Vector{}
	}
	consumed, hasConsumed := r.ConsumedCapacity[devicemodel.CapMemory]
	d := c.Lookup(r.Pool, r.Device)
	if d == nil {
		var v queue.Vector
		if hasConsumed {
			v[queue.Memory] = max(satValue(consumed), 0)
		}
		if n, err := devicemodel.ParseName(r.Device); err == nil && n.Type == devicemodel.TypeGPU && !hasConsumed {
			v[queue.GPUs] = queue.GPU
		}
		return v
	}
	if d.Shareable && hasConsumed {
		return d.shareCharge(max(satValue(consumed), 0))
	}
	return d.wholeCharge()
}

// ChargeAllocation sums ChargeResult over an allocation.
func (c *Catalog) ChargeAllocation(a *resourceapi.AllocationResult) queue.Vector {
	var v queue.Vector
	if a == nil {
		return v
	}
	for i := range a.Devices.Results {
		v = v.Add(c.ChargeResult(&a.Devices.Results[i]))
	}
	return v
}

// BadInputError is a claim problem that waiting will not fix: a request for
// another driver's device class, a class that does not exist.
type BadInputError struct{ Msg string }

func (e *BadInputError) Error() string { return e.Msg }

// EstimateClaim estimates what a claim will be charged before it is
// allocated, conservatively: per request, the largest charge over the
// device shapes published in the cluster that the class and the request's
// selectors match, times the count (firstAvailable: the largest
// alternative). Requests of other drivers' classes (a NIC next to the
// GPUs) charge nothing; the admission simulation still places them
// against their drivers' slices. It fails with a *BadInputError for a
// class that does not exist and with a plain error when no published
// device matches (yet).
func (c *Catalog) EstimateClaim(ctx context.Context, claimName string, spec *resourceapi.ResourceClaimSpec) (queue.Vector, error) {
	var total queue.Vector
	for _, req := range spec.Devices.Requests {
		var v queue.Vector
		switch {
		case req.Exactly != nil:
			est, err := c.estimateRequest(ctx, claimName, req.Name, req.Exactly.DeviceClassName, req.Exactly.Selectors,
				req.Exactly.AllocationMode, req.Exactly.Count, req.Exactly.Capacity, ptr.Deref(req.Exactly.AdminAccess, false))
			if err != nil {
				return queue.Vector{}, err
			}
			v = est
		case len(req.FirstAvailable) > 0:
			var errs []error
			found := false
			for _, sub := range req.FirstAvailable {
				est, err := c.estimateRequest(ctx, claimName, req.Name+"/"+sub.Name, sub.DeviceClassName, sub.Selectors,
					sub.AllocationMode, sub.Count, sub.Capacity, false)
				if bad, ok := err.(*BadInputError); ok {
					return queue.Vector{}, bad
				}
				if err != nil {
					errs = append(errs, err)
					continue
				}
				found = true
				v = v.Max(est)
			}
			if !found && len(errs) > 0 {
				return queue.Vector{}, errs[0]
			}
		}
		total = total.Add(v)
	}
	return total, nil
}

func (c *Catalog) estimateRequest(ctx context.Context, claimName, reqName, className string, selectors []resourceapi.DeviceSelector,
	mode resourceapi.DeviceAllocationMode, count int64, capacity *resourceapi.CapacityRequirements, adminAccess bool) (queue.Vector, error) {
	dc := c.classes[className]
	if dc == nil {
		return queue.Vector{}, &BadInputError{fmt.Sprintf("claim %s request %s: device class %q does not exist", claimName, reqName, className)}
	}
	_ = adminAccess // charged like any other request (see ChargeResult)
	if !c.IsOurClass(ctx, dc) {
		return queue.Vector{}, nil
	}
	var share int64 = -1
	if capacity != nil {
		if q, ok := capacity.Requests[devicemodel.CapMemory]; ok {
			share = max(satValue(q), 0)
		}
	}
	var best queue.Vector
	matched := false
	for _, d := range c.shapes {
		if !c.matches(ctx, d, dc.Spec.Selectors) || !c.matches(ctx, d, selectors) {
			continue
		}
		matched = true
		if share >= 0 && d.Shareable {
			best = best.Max(d.shareCharge(d.roundShare(share)))
		} else {
			best = best.Max(d.wholeCharge())
		}
	}
	if !matched {
		return queue.Vector{}, fmt.Errorf("claim %s request %s: no published %s device matches class %s and the request's selectors", claimName, reqName, c.Driver, className)
	}
	if mode == resourceapi.DeviceAllocationModeAll {
		// All matching devices of one node: the largest node's.
		var most queue.Vector
		for _, devs := range c.perNode {
			var sum queue.Vector
			for _, d := range devs {
				if c.matches(ctx, d, dc.Spec.Selectors) && c.matches(ctx, d, selectors) {
					sum = sum.Add(d.wholeCharge())
				}
			}
			most = most.Max(sum)
		}
		return most, nil
	}
	n := max(count, 1)
	return queue.Vector{queue.Memory: queue.SatMul(best[queue.Memory], n), queue.GPUs: queue.SatMul(best[queue.GPUs], n)}, nil
}

// matches evaluates CEL selectors against a device; a selector that fails
// to evaluate (e.g. it uses derived attributes) counts as a match, which
// keeps the estimate conservative.
func (c *Catalog) matches(ctx context.Context, d *Device, selectors []resourceapi.DeviceSelector) bool {
	for _, s := range selectors {
		if s.CEL == nil {
			continue
		}
		k := selectorOnDevice{d, s.CEL.Expression}
		c.mu.Lock()
		ok, known := c.results[k]
		c.mu.Unlock()
		if !known {
			ok = true
			if res := c.cache.GetOrCompile(s.CEL.Expression); res.Error == nil {
				m, _, err := res.DeviceMatches(ctx, d.celDevice(c.Driver))
				ok = m || err != nil
			}
			c.mu.Lock()
			if c.results == nil {
				c.results = map[selectorOnDevice]bool{}
			}
			c.results[k] = ok
			c.mu.Unlock()
		}
		if !ok {
			return false
		}
	}
	return true
}

// evalSelectors evaluates CEL selectors against a device as the allocator
// does: all must match; the first that does not compile or fails to
// evaluate is the error.
func evalSelectors(ctx context.Context, cache *cel.Cache, d cel.Device, selectors []resourceapi.DeviceSelector) (bool, error) {
	for _, s := range selectors {
		if s.CEL == nil {
			continue
		}
		res := cache.GetOrCompile(s.CEL.Expression)
		if res.Error != nil {
			return false, res.Error
		}
		ok, _, err := res.DeviceMatches(ctx, d)
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// MemoryUsed is the device memory a claim's processes use on this
// driver's devices, from the usage the kubelet plugin writes into the
// claim's status.devices (v1alpha1.DeviceStatus.Usage). sampled is false
// when no entry carries a sample yet: unknown, not zero.
func (c *Catalog) MemoryUsed(claim *resourceapi.ResourceClaim) (used uint64, sampled bool) {
	for _, d := range claim.Status.Devices {
		if d.Driver != c.Driver || d.Data == nil {
			continue
		}
		var st v1alpha1.DeviceStatus
		if err := json.Unmarshal(d.Data.Raw, &st); err != nil || st.Usage == nil {
			continue
		}
		used += st.Usage.MemoryUsedBytes
		sampled = true
	}
	return used, sampled
}
