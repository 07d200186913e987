package admission

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// The shortcuts below make placement with many selective devices (MIG
// placements, prioritized lists) cheap without changing any placement:
//
//  1. CEL selector results are cached per expression and device content
//     within a cycle. A device's content is what CEL sees (driver,
//     attributes, capacity, allowMultipleAllocations), so identical nodes
//     share the results.
//  2. The allocator gets only the devices some alternative of the claims
//     can select (class and request selectors all match), plus every
//     device that is allocated. Every slice stays, so pools stay complete;
//     devices keep their order, so the allocator's first choice among the
//     devices it could select is the same. The allocator derives the
//     counters in use (sharedCounters / consumesCounters) from the
//     allocated devices only, and allocated devices all stay, so counter
//     checks see the same numbers. A device that no alternative selects is
//     never a candidate, so dropping it cannot change a result.
//  3. A failure is remembered per alternative of a one-request claim: when
//     a claim with a single request fails on a node, none of its
//     alternatives (each subrequest of a prioritized list, or the request)
//     finds a device there. An alternative with the same class,
//     selectors, mode, count and tolerations and an equal or larger
//     capacity request fails there as well, until the node's allocations
//     change; a one-request claim all of whose alternatives are known to
//     fail is not tried. Only claims allocated on their own use it (no
//     constraints across claims or requests).
//
// Config.ExactPlacement turns them off; tests compare both ways.

// deviceContentKey identifies what CEL sees of a device.
func deviceContentKey(driver string, d *resourceapi.Device) string {
	var b strings.Builder
	b.WriteString(driver)
	if d.AllowMultipleAllocations != nil {
		b.WriteString("|m" + strconv.FormatBool(*d.AllowMultipleAllocations))
	}
	names := make([]string, 0, len(d.Attributes))
	for n := range d.Attributes {
		names = append(names, string(n))
	}
	slices.Sort(names)
	for _, n := range names {
		a := d.Attributes[resourceapi.QualifiedName(n)]
		b.WriteString("|a" + n + "=")
		switch {
		case a.IntValue != nil:
			b.WriteString("i" + strconv.FormatInt(*a.IntValue, 10))
		case a.BoolValue != nil:
			b.WriteString("b" + strconv.FormatBool(*a.BoolValue))
		case a.StringValue != nil:
			b.WriteString("s" + strconv.Quote(*a.StringValue))
		case a.VersionValue != nil:
			b.WriteString("v" + strconv.Quote(*a.VersionValue))
		default:
			data, _ := json.Marshal(a)
			b.Write(data)
		}
	}
	names = names[:0]
	for n := range d.Capacity {
		names = append(names, string(n))
	}
	slices.Sort(names)
	for _, n := range names {
		c := d.Capacity[resourceapi.QualifiedName(n)]
		b.WriteString("|c" + n + "=" + c.Value.String())
	}
	return b.String()
}

// alternative is one way a request can be satisfied: its class and
// selectors (what picks devices) and the rest of it.
type alternative struct {
	class     string
	selectors []string
	// key is everything but the name and the capacity requests.
	key  string
	caps map[resourceapi.QualifiedName]resource.Quantity
}

// claimShape is what the shortcuts know about a claim.
type claimShape struct {
	// selSig identifies the selectors of all alternatives of all requests.
	selSig string
	alts   []alternative
	// single: one request, no constraints; alts are its alternatives.
	single bool
}

func (p *placer) shapeOf(cl *resourceapi.ResourceClaim) *claimShape {
	if s, ok := p.shapes[cl]; ok {
		return s
	}
	s := &claimShape{single: len(cl.Spec.Devices.Requests) == 1 && len(cl.Spec.Devices.Constraints) == 0}
	var sig strings.Builder
	add := func(class string, sels []resourceapi.DeviceSelector, rest any, caps *resourceapi.CapacityRequirements) {
		a := alternative{class: class}
		sig.WriteString(class)
		for _, sel := range sels {
			expr := ""
			if sel.CEL != nil {
				expr = sel.CEL.Expression
			}
			a.selectors = append(a.selectors, expr)
			sig.WriteString("\x00" + expr)
		}
		sig.WriteString("\x01")
		data, _ := json.Marshal(rest)
		a.key = string(data)
		if caps != nil {
			a.caps = caps.Requests
		}
		s.alts = append(s.alts, a)
	}
	for _, r := range cl.Spec.Devices.Requests {
		if e := r.Exactly; e != nil {
			rest := *e
			rest.Capacity = nil
			add(e.DeviceClassName, e.Selectors, rest, e.Capacity)
		}
		for _, sub := range r.FirstAvailable {
			rest := sub
			rest.Name, rest.Capacity = "", nil
			add(sub.DeviceClassName, sub.Selectors, rest, sub.Capacity)
		}
		sig.WriteString("\x02")
	}
	s.selSig = sig.String()
	p.shapes[cl] = s
	return s
}

// exprDevice is a CEL expression evaluated on a device's content.
type exprDevice struct {
	expr, device string
}

// matches says whether the expression selects the device; an expression
// that does not compile or fails counts as a match, so that the allocator
// sees the device and reports the error itself.
func (p *placer) matches(ctx context.Context, expr, contentKey, driver string, d *resourceapi.Device) bool {
	k := exprDevice{expr, contentKey}
	if v, ok := p.celResults[k]; ok {
		return v
	}
	res := p.cel.GetOrCompile(expr)
	v := true
	if res.Error == nil {
		m, _, err := res.DeviceMatches(ctx, cel.Device{Driver: driver, AllowMultipleAllocations: d.AllowMultipleAllocations, Attributes: d.Attributes, Capacity: d.Capacity})
		v = m || err != nil
	}
	p.celResults[k] = v
	return v
}

// selectable says whether some alternative of the shapes selects the
// device (classes that do not exist select everything, for the same
// reason).
func (p *placer) selectable(ctx context.Context, shapes []*claimShape, contentKey, driver string, d *resourceapi.Device) bool {
	for _, s := range shapes {
	alts:
		for _, a := range s.alts {
			if class, err := p.classes.Get(a.class); err == nil {
				for _, sel := range class.Spec.Selectors {
					if sel.CEL != nil && !p.matches(ctx, sel.CEL.Expression, contentKey, driver, d) {
						continue alts
					}
				}
			}
			for _, expr := range a.selectors {
				if !p.matches(ctx, expr, contentKey, driver, d) {
					continue alts
				}
			}
			return true
		}
	}
	return false
}

type maskKey struct {
	node int
	sig  string
}

// slicesFor returns the node's slices with only the devices the claims can
// select and the allocated ones.
func (p *placer) slicesFor(ctx context.Context, sn *placeNode, claims []*resourceapi.ResourceClaim) []*resourceapi.ResourceSlice {
	if p.exact {
		return sn.slices
	}
	shapes := make([]*claimShape, len(claims))
	sig := ""
	for i, cl := range claims {
		shapes[i] = p.shapeOf(cl)
		sig += shapes[i].selSig + "\x03"
	}
	mk := maskKey{sn.idx, sig}
	mask, ok := p.masks[mk]
	if !ok {
		if sn.contentKeys == nil {
			sn.contentKeys = make([][]string, len(sn.slices))
			for i, s := range sn.slices {
				for j := range s.Spec.Devices {
					sn.contentKeys[i] = append(sn.contentKeys[i], deviceContentKey(s.Spec.Driver, &s.Spec.Devices[j]))
				}
			}
		}
		mask = make([][]bool, len(sn.slices))
		for i, s := range sn.slices {
			for j := range s.Spec.Devices {
				mask[i] = append(mask[i], p.selectable(ctx, shapes, sn.contentKeys[i][j], s.Spec.Driver, &s.Spec.Devices[j]))
			}
		}
		p.masks[mk] = mask
	}
	out := make([]*resourceapi.ResourceSlice, len(sn.slices))
	for i, s := range sn.slices {
		keep := make([]resourceapi.Device, 0, len(s.Spec.Devices))
		for j, d := range s.Spec.Devices {
			if mask[i][j] || sn.held[structured.MakeDeviceID(s.Spec.Driver, s.Spec.Pool.Name, d.Name)] > 0 {
				keep = append(keep, d)
			}
		}
		if len(keep) == len(s.Spec.Devices) {
			out[i] = s
			continue
		}
		c := *s
		c.Spec.Devices = keep
		out[i] = &c
	}
	return out
}

// knownToFail says whether the claims are one one-request claim all of
// whose alternatives failed on the node in its current state.
func (p *placer) knownToFail(sn *placeNode, claims []*resourceapi.ResourceClaim) bool {
	if p.exact || len(claims) != 1 || sn.altFailsAt != sn.version {
		return false
	}
	s := p.shapeOf(claims[0])
	if !s.single {
		return false
	}
	for _, a := range s.alts {
		if !slices.ContainsFunc(sn.altFails[a.key], func(f map[resourceapi.QualifiedName]resource.Quantity) bool { return capsAtLeast(a.caps, f) }) {
			return false
		}
	}
	return true
}

// failed records that the claims did not fit on the node as it is.
func (p *placer) failed(sn *placeNode, claims []*resourceapi.ResourceClaim) {
	if p.exact || len(claims) != 1 {
		return
	}
	s := p.shapeOf(claims[0])
	if !s.single {
		return
	}
	if sn.altFailsAt != sn.version || sn.altFails == nil {
		sn.altFails, sn.altFailsAt = map[string][]map[resourceapi.QualifiedName]resource.Quantity{}, sn.version
	}
	for _, a := range s.alts {
		sn.altFails[a.key] = append(sn.altFails[a.key], a.caps)
	}
}

// capsAtLeast says whether the capacity request want is at least have,
// for the same capacities.
func capsAtLeast(want, have map[resourceapi.QualifiedName]resource.Quantity) bool {
	if len(want) != len(have) {
		return false
	}
	for n, h := range have {
		w, ok := want[n]
		if !ok || w.Cmp(h) < 0 {
			return false
		}
	}
	return true
}
