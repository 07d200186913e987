// Package sliceintern is the transform the controller's cache applies to
// every ResourceSlice before it stores it: the parts that many devices
// publish alike are kept once and shared by every device that publishes
// them, so that the controller's memory grows with what differs between
// devices, not with everything each one repeats.
//
// Shared: capacity maps (one per MIG profile or GPU model, not one per
// device), counter consumptions and shared counter sets (one per
// placement, not one per node), attribute values (productName, driver
// versions, profile names: one string each) and the strings of names and
// attribute keys. The devices' attributes leave the API's form: the
// interner keeps them in a compact form beside the cache (attrs.go:
// numbers into each slice's shared values), and readers ask it for them
// (Attributes, WithAttributes).
//
// The shared parts are read-only, as every object of an informer's store
// is: readers that change a slice copy it first (DeepCopy, as the
// controller's taint rules do), and a deep copy gets maps of its own.
//
// The interner's tables remember a shared part for at least one period
// after a slice last brought it: when a slice arrives and a period has
// passed since the last rotation, what no slice brought during the period
// before is forgotten. A part that a republished or deleted slice no
// longer uses is then reachable from nothing and freed (with no slice
// arriving at all, the tables keep what they hold: a few parts per GPU
// model and placement, not per device). A part still in use by a slice that
// was stored long ago stays shared by that slice; a slice that brings it
// again later gets the copy that slice brought, shared from then on.
package sliceintern

import (
	"encoding/json"
	"strconv"
	"sync"
	"time"
	"unique"

	resourceapi "k8s.io/api/resource/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// DefaultPeriod is how long a shared part is remembered at least.
const DefaultPeriod = 10 * time.Minute

// Interner shares identical parts of the ResourceSlices it transforms.
// Its zero value is not usable: use New.
type Interner struct {
	mu      sync.Mutex
	now     func() time.Time
	period  time.Duration
	rotated time.Time

	capacities table[map[resourceapi.QualifiedName]resourceapi.DeviceCapacity]
	consumes   table[[]resourceapi.DeviceCounterConsumption]
	counters   table[map[string]resourceapi.Counter]
	strs       table[*string]
	ints       table[*int64]
	bools      table[*bool]
	attrs      table[*resourceapi.DeviceAttribute]
	keySets    table[*keySet]

	// amu guards compact, the attributes of the slices Transform stored
	// (attrs.go), which readers use concurrently with the transform.
	amu     sync.RWMutex
	compact map[sliceKey]*compactSlice
}

// New returns an interner that remembers shared parts for at least period
// (DefaultPeriod when 0); now is the clock (time.Now when nil).
func New(period time.Duration, now func() time.Time) *Interner {
	if period <= 0 {
		period = DefaultPeriod
	}
	if now == nil {
		now = time.Now
	}
	return &Interner{now: now, period: period, rotated: now()}
}

// Transform is the cache's transform for ResourceSlices
// (cache.ByObject.Transform): it drops the managed fields, which the
// controller never reads, and shares what the slice's devices repeat.
// Other objects pass unchanged.
func (in *Interner) Transform() toolscache.TransformFunc {
	return func(obj any) (any, error) {
		s, ok := obj.(*resourceapi.ResourceSlice)
		if !ok {
			return obj, nil
		}
		s.ManagedFields = nil
		in.intern(s, true)
		return s, nil
	}
}

// Slice shares the parts of s that other slices publish alike, in place.
// s must not be in use elsewhere (the cache calls it on the object it has
// just decoded).
func (in *Interner) Slice(s *resourceapi.ResourceSlice) { in.intern(s, false) }

// intern shares what s repeats; with compact, its devices' attributes go
// to the compact table (attrs.go).
func (in *Interner) intern(s *resourceapi.ResourceSlice, compact bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if t := in.now(); t.Sub(in.rotated) >= in.period {
		in.rotate(t)
	}
	s.Spec.Driver = str(s.Spec.Driver)
	s.Spec.Pool.Name = str(s.Spec.Pool.Name)
	s.Spec.NodeName = in.strPtr(s.Spec.NodeName)
	for i := range s.Spec.SharedCounters {
		set := &s.Spec.SharedCounters[i]
		set.Name = str(set.Name)
		set.Counters = shared(&in.counters, set.Counters)
	}
	compact = compact && s.UID != "" && s.ResourceVersion != ""
	for i := range s.Spec.Devices {
		in.device(&s.Spec.Devices[i], !compact)
	}
	if compact && !in.compactAttributes(s) {
		for i := range s.Spec.Devices {
			in.attributes(&s.Spec.Devices[i])
		}
	}
}

func (in *Interner) device(d *resourceapi.Device, attributes bool) {
	d.Name = str(d.Name)
	d.Capacity = shared(&in.capacities, d.Capacity)
	d.ConsumesCounters = shared(&in.consumes, d.ConsumesCounters)
	d.NodeName = in.strPtr(d.NodeName)
	if attributes {
		in.attributes(d)
	}
}

// attributes gives d a map of its own whose keys and values are shared.
func (in *Interner) attributes(d *resourceapi.Device) {
	if len(d.Attributes) == 0 {
		return
	}
	// A new map with the same number of entries takes what the decoded
	// one took; its keys and values point to shared strings and numbers.
	attrs := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(d.Attributes))
	for k, v := range d.Attributes {
		v.StringValue = in.strPtr(v.StringValue)
		v.VersionValue = in.strPtr(v.VersionValue)
		v.IntValue = in.intPtr(v.IntValue)
		v.BoolValue = in.boolPtr(v.BoolValue)
		attrs[resourceapi.QualifiedName(str(string(k)))] = v
	}
	d.Attributes = attrs
}

// rotate starts a new period: what was not asked for in the last one is
// forgotten.
func (in *Interner) rotate(t time.Time) {
	in.rotated = t
	in.capacities.rotate()
	in.consumes.rotate()
	in.counters.rotate()
	in.strs.rotate()
	in.ints.rotate()
	in.bools.rotate()
	in.attrs.rotate()
	in.keySets.rotate()
}

// Len is the number of shared parts the interner remembers.
func (in *Interner) Len() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.capacities.len() + in.consumes.len() + in.counters.len() + in.strs.len() + in.ints.len() + in.bools.len() +
		in.attrs.len() + in.keySets.len()
}

func (in *Interner) strPtr(p *string) *string {
	if p == nil {
		return nil
	}
	return in.strs.get(*p, p)
}

func (in *Interner) intPtr(p *int64) *int64 {
	if p == nil {
		return nil
	}
	return in.ints.get(strconv.FormatInt(*p, 10), p)
}

func (in *Interner) boolPtr(p *bool) *bool {
	if p == nil {
		return nil
	}
	return in.bools.get(strconv.FormatBool(*p), p)
}

// str shares a string's bytes with every equal string made by str
// (unique: freed when none is left).
func str(s string) string { return unique.Make(s).Value() }

// shared returns the remembered part equal to v, or remembers v. Parts are
// compared by their JSON form (maps in key order, quantities as strings),
// so that equal values written differently ("1Gi" and "1024Mi") stay
// apart: sharing never changes what a reader sees.
func shared[T any](t *table[T], v T) T {
	key, err := json.Marshal(v)
	if err != nil || string(key) == "null" || string(key) == "{}" || string(key) == "[]" {
		return v
	}
	return t.get(string(key), v)
}

// table remembers values by key over two periods: cur holds what was
// asked for in this one, prev what was asked for in the last.
type table[T any] struct {
	cur, prev map[string]T
}

func (t *table[T]) get(key string, v T) T {
	if got, ok := t.cur[key]; ok {
		return got
	}
	if t.cur == nil {
		t.cur = map[string]T{}
	}
	if got, ok := t.prev[key]; ok {
		v = got
	}
	t.cur[key] = v
	return v
}

func (t *table[T]) rotate() { t.prev, t.cur = t.cur, map[string]T{} }

func (t *table[T]) len() int {
	n := len(t.cur)
	for k := range t.prev {
		if _, ok := t.cur[k]; !ok {
			n++
		}
	}
	return n
}
