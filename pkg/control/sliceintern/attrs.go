package sliceintern

// The compact form of the devices' attributes. A device's attribute map
// is what a cached slice holds most of per device (15 attributes in a map
// of 32 slots of a 16-byte name and a 128-byte value: about 4.6 KiB), so
// the cache does not keep it: Transform moves each slice's attributes to
// a table of the interner, as numbers into the slice's own dictionary of
// values (each value one shared object: a GPU's UUID is kept once for
// every device of that GPU, a product name once for the cluster), and
// leaves the devices' Attributes nil. Readers ask the interner for a
// device's attributes (Attributes): a lookup by name, or a map made for
// the one reader that needs the API's form (the allocator, CEL).
//
// The table is keyed by the slice's UID and resourceVersion, which every
// copy of the stored object keeps, and lives as long as the object the
// cache stores: a cleanup on its devices frees the entry once the cache
// replaced or dropped that object and no reader holds it any more.

import (
	"encoding/json"
	"iter"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"weak"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Attrs is one device's attributes: its own map (a slice not in compact
// form, e.g. read from the API or a file), or its entry in the cache's
// compact form. The zero value has none.
type Attrs struct {
	own map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	c   *compactSlice
	i   int32
}

// MapAttrs returns the attributes of a device that carries them in the
// API's form.
func MapAttrs(m map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) Attrs {
	return Attrs{own: m}
}

// Get returns the attribute named n.
func (a Attrs) Get(n resourceapi.QualifiedName) (resourceapi.DeviceAttribute, bool) {
	if a.c == nil {
		v, ok := a.own[n]
		return v, ok
	}
	d := a.c.devs[a.i]
	k := a.c.keys[d.keys]
	p, ok := k.pos[n]
	if !ok {
		return resourceapi.DeviceAttribute{}, false
	}
	return *a.c.dict[a.c.vals[int(d.off)+p]], true
}

// Len is the number of attributes.
func (a Attrs) Len() int {
	if a.c == nil {
		return len(a.own)
	}
	return len(a.c.keys[a.c.devs[a.i].keys].names)
}

// All yields every attribute (in name order for the compact form, in map
// order otherwise).
func (a Attrs) All() iter.Seq2[resourceapi.QualifiedName, resourceapi.DeviceAttribute] {
	return func(yield func(resourceapi.QualifiedName, resourceapi.DeviceAttribute) bool) {
		if a.c == nil {
			for n, v := range a.own {
				if !yield(n, v) {
					return
				}
			}
			return
		}
		d := a.c.devs[a.i]
		for p, n := range a.c.keys[d.keys].names {
			if !yield(n, *a.c.dict[a.c.vals[int(d.off)+p]]) {
				return
			}
		}
	}
}

// Map returns the attributes in the API's form: the device's own map, or
// a new one made from the compact form (whose values point to shared
// strings and numbers, which nobody may change).
func (a Attrs) Map() map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	if a.c == nil {
		return a.own
	}
	m := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, a.Len())
	for n, v := range a.All() {
		m[n] = v
	}
	return m
}

// Attributes returns the attributes of device i of slice s: its own map
// when it has one, else what the interner keeps for the slice (found by
// the slice's UID and resourceVersion, so any copy of the cached object
// finds it). A nil interner reads the device's own map.
func (in *Interner) Attributes(s *resourceapi.ResourceSlice, i int) Attrs {
	d := &s.Spec.Devices[i]
	if in == nil || d.Attributes != nil {
		return Attrs{own: d.Attributes}
	}
	in.amu.RLock()
	c := in.compact[sliceKey{s.UID, s.ResourceVersion}]
	in.amu.RUnlock()
	if c == nil || i >= len(c.devs) {
		return Attrs{}
	}
	return Attrs{c: c, i: int32(i)}
}

// WithAttributes returns s with every device's attributes in the API's
// form: s itself when nothing of it is in compact form, else a copy whose
// devices have maps of their own (the rest shared with s).
func (in *Interner) WithAttributes(s *resourceapi.ResourceSlice) *resourceapi.ResourceSlice {
	var out []resourceapi.Device
	for j := range s.Spec.Devices {
		if s.Spec.Devices[j].Attributes != nil {
			continue
		}
		if m := in.Attributes(s, j).Map(); m != nil {
			if out == nil {
				out = slices.Clone(s.Spec.Devices)
			}
			out[j].Attributes = m
		}
	}
	if out == nil {
		return s
	}
	c := *s
	c.Spec.Devices = out
	return &c
}

// Subset returns a copy of s with only the devices at positions pos (for
// example the few an allocation may choose from), each with its
// attributes in the API's form.
func (in *Interner) Subset(s *resourceapi.ResourceSlice, pos []int) *resourceapi.ResourceSlice {
	out := make([]resourceapi.Device, len(pos))
	for k, j := range pos {
		out[k] = s.Spec.Devices[j]
		if out[k].Attributes == nil {
			out[k].Attributes = in.Attributes(s, j).Map()
		}
	}
	c := *s
	c.Spec.Devices = out
	return &c
}

// sliceKey names a version of a slice.
type sliceKey struct {
	uid types.UID
	rv  string
}

// compactSlice is the attributes of one stored slice's devices: per
// device the set of names it has (keys) and where its values start in
// vals; vals are numbers into dict, the slice's distinct values.
type compactSlice struct {
	owner weak.Pointer[resourceapi.Device]
	keys  []*keySet
	dict  []*resourceapi.DeviceAttribute
	devs  []compactDevice
	vals  []uint16
}

type compactDevice struct {
	off  uint32
	keys uint16
}

// keySet is a sorted set of attribute names, shared by every device that
// has exactly these names.
type keySet struct {
	names []resourceapi.QualifiedName
	pos   map[resourceapi.QualifiedName]int
}

// compactAttributes moves the attributes of s's devices to the compact
// table (s is a stored object: UID and resourceVersion set), and says
// whether they fit in the compact form (else s keeps them); called with
// in.mu held.
func (in *Interner) compactAttributes(s *resourceapi.ResourceSlice) bool {
	if len(s.Spec.Devices) == 0 {
		return true
	}
	owner := weak.Make(&s.Spec.Devices[0])
	key := sliceKey{s.UID, s.ResourceVersion}
	in.amu.RLock()
	done := in.compact[key]
	in.amu.RUnlock()
	if done != nil && done.owner == owner {
		// Transformed before: an informer may transform an object more
		// than once (a transform must be idempotent).
		return true
	}
	c := &compactSlice{owner: owner}
	setIdx := map[*keySet]uint16{}
	valIdx := map[*resourceapi.DeviceAttribute]uint16{}
	names := make([]resourceapi.QualifiedName, 0, 16)
	for i := range s.Spec.Devices {
		attrs := s.Spec.Devices[i].Attributes
		names = names[:0]
		for n := range attrs {
			names = append(names, n)
		}
		slices.Sort(names)
		ks := in.keySet(names)
		ki, ok := number(setIdx, &c.keys, ks)
		if !ok {
			return false // beyond the compact form
		}
		c.devs = append(c.devs, compactDevice{off: uint32(len(c.vals)), keys: ki})
		for _, n := range ks.names {
			vi, ok := number(valIdx, &c.dict, in.attribute(attrs[n]))
			if !ok {
				return false
			}
			c.vals = append(c.vals, vi)
		}
	}
	for i := range s.Spec.Devices {
		s.Spec.Devices[i].Attributes = nil
	}
	in.amu.Lock()
	if in.compact == nil {
		in.compact = map[sliceKey]*compactSlice{}
	}
	in.compact[key] = c
	in.amu.Unlock()
	runtime.AddCleanup(&s.Spec.Devices[0], in.forget, owned{key, c.owner})
	return true
}

// number returns v's number in list, adding v when it is new; false when
// the list is full (the compact form numbers in 16 bits).
func number[T comparable](index map[T]uint16, list *[]T, v T) (uint16, bool) {
	if i, ok := index[v]; ok {
		return i, true
	}
	if len(*list) >= 1<<16 {
		return 0, false
	}
	i := uint16(len(*list))
	index[v] = i
	*list = append(*list, v)
	return i, true
}

type owned struct {
	key   sliceKey
	owner weak.Pointer[resourceapi.Device]
}

// forget drops a slice's entry once the object it was made for is gone
// (not an entry a later copy of the same version made for its own).
func (in *Interner) forget(o owned) {
	in.amu.Lock()
	defer in.amu.Unlock()
	if c := in.compact[o.key]; c != nil && c.owner == o.owner {
		delete(in.compact, o.key)
	}
}

// CompactSlices is the number of slices whose attributes the interner
// keeps in compact form.
func (in *Interner) CompactSlices() int {
	in.amu.RLock()
	defer in.amu.RUnlock()
	return len(in.compact)
}

func (in *Interner) keySet(names []resourceapi.QualifiedName) *keySet {
	var b strings.Builder
	for _, n := range names {
		b.WriteString(string(n))
		b.WriteByte(0)
	}
	key := b.String()
	if ks, ok := in.keySets.cur[key]; ok {
		return ks
	}
	ks := &keySet{names: make([]resourceapi.QualifiedName, len(names)), pos: make(map[resourceapi.QualifiedName]int, len(names))}
	for i, n := range names {
		n = resourceapi.QualifiedName(str(string(n)))
		ks.names[i], ks.pos[n] = n, i
	}
	return in.keySets.get(key, ks)
}

// attribute returns the shared object equal to a (its pointers shared
// too).
func (in *Interner) attribute(a resourceapi.DeviceAttribute) *resourceapi.DeviceAttribute {
	var key string
	switch {
	case a.StringValue != nil && a.IntValue == nil && a.BoolValue == nil && a.VersionValue == nil && a.IntValues == nil && a.BoolValues == nil && a.StringValues == nil && a.VersionValues == nil:
		key = "s" + *a.StringValue
	case a.IntValue != nil && a.StringValue == nil && a.BoolValue == nil && a.VersionValue == nil && a.IntValues == nil && a.BoolValues == nil && a.StringValues == nil && a.VersionValues == nil:
		key = "i" + strconv.FormatInt(*a.IntValue, 10)
	default:
		data, _ := json.Marshal(a)
		key = "j" + string(data)
	}
	if v, ok := in.attrs.cur[key]; ok {
		return v
	}
	a.StringValue = in.strPtr(a.StringValue)
	a.VersionValue = in.strPtr(a.VersionValue)
	a.IntValue = in.intPtr(a.IntValue)
	a.BoolValue = in.boolPtr(a.BoolValue)
	return in.attrs.get(key, &a)
}
