package decide

import (
	"context"
	"encoding/json"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/structured"
)

// The placement shortcuts make placement with many selective devices (MIG
// placements, prioritized lists) cheap without changing any placement. One
// file each: CEL results (shortcuts_cel.go), each node's device index
// (shortcuts_index.go), the ladder (shortcuts_ladder.go), remembered
// failures (shortcuts_failures.go); this file has what the allocator is
// given (2) and the claims' shapes.
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
//  3. The ladder (allocateLadder) gives the allocator a few candidates
//     of one alternative at a time; when the other devices it lists cannot
//     be taken anyway, it first asks with the alternative's selectors left
//     out (no CEL per device), then once more, exactly, over the device
//     found (see allocateListed).
//  4. A failure is remembered per alternative of a one-request claim: when
//     a claim with a single request fails on a node, none of its
//     alternatives (each subrequest of a prioritized list, or the request)
//     finds a device there. An alternative with the same class,
//     selectors, mode, count and tolerations and an equal or larger
//     capacity request fails there as well, until the node's allocations
//     change; a one-request claim all of whose alternatives are known to
//     fail is not tried. Only claims allocated on their own use it (no
//     constraints across claims or requests).
//
// They rely on two behaviours of the upstream allocator that its API does
// not promise: first fit in list order (2, 3) and counters derived from
// the allocated devices alone (2). assumptions_test.go pins both for every
// feature set the controller can run the allocator with, so an upstream
// change fails there first.
//
// Config.ExactPlacement turns them off; tests compare both ways, for every
// such feature set (TestShortcutsPlaceAsExact).

// alternative is one way a request can be satisfied: its class and
// selectors (what picks devices) and the rest of it.
type alternative struct {
	class     string
	selectors []string
	// selKey identifies class and selectors; result is the request name
	// an allocation by this alternative carries.
	selKey, result string
	// ladder: exact count, no admin access (see allocateLadder).
	ladder bool
	// blockID stands for key and capacity requests (placer.blockIDs).
	blockID int
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
	spec := p.specJSON(cl)
	if s, ok := p.shapes[spec]; ok {
		return s
	}
	s := &claimShape{single: len(cl.Spec.Devices.Requests) == 1 && len(cl.Spec.Devices.Constraints) == 0}
	var sig strings.Builder
	add := func(result, class string, sels []resourceapi.DeviceSelector, rest any, caps *resourceapi.CapacityRequirements, ladder bool) {
		a := alternative{class: class, result: result, ladder: ladder}
		start := sig.Len()
		sig.WriteString(class)
		for _, sel := range sels {
			expr := ""
			if sel.CEL != nil {
				expr = sel.CEL.Expression
			}
			a.selectors = append(a.selectors, expr)
			sig.WriteString("\x00" + expr)
		}
		a.selKey = sig.String()[start:]
		sig.WriteString("\x01")
		data, _ := json.Marshal(rest)
		a.key = string(data)
		block := a.key
		if caps != nil {
			capsData, _ := json.Marshal(caps)
			block += string(capsData)
		}
		id, ok := p.blockIDs[block]
		if !ok {
			id = len(p.blockIDs)
			p.blockIDs[block] = id
		}
		a.blockID = id
		if caps != nil {
			a.caps = caps.Requests
		}
		s.alts = append(s.alts, a)
	}
	for _, r := range cl.Spec.Devices.Requests {
		if e := r.Exactly; e != nil {
			rest := *e
			rest.Capacity = nil
			add(r.Name, e.DeviceClassName, e.Selectors, rest, e.Capacity, ladderable(e.AllocationMode, e.Count, e.AdminAccess))
		}
		for _, sub := range r.FirstAvailable {
			rest := sub
			rest.Name, rest.Capacity = "", nil
			add(r.Name+"/"+sub.Name, sub.DeviceClassName, sub.Selectors, rest, sub.Capacity, ladderable(sub.AllocationMode, sub.Count, nil))
		}
		sig.WriteString("\x02")
	}
	s.selSig = sig.String()
	p.shapes[spec] = s
	return s
}

// selectable says whether some alternative of the shapes selects the
// node's device at pos (classes that do not exist select everything, for
// the same reason).
func (p *placer) selectable(ctx context.Context, shapes []*claimShape, sn *placeNode, pos devPos) bool {
	for _, s := range shapes {
	alts:
		for _, a := range s.alts {
			if class, err := p.classes.Get(a.class); err == nil {
				for _, sel := range class.Spec.Selectors {
					if sel.CEL != nil && !p.matches(ctx, sel.CEL.Expression, sn, pos) {
						continue alts
					}
				}
			}
			for _, expr := range a.selectors {
				if !p.matches(ctx, expr, sn, pos) {
					continue alts
				}
			}
			return true
		}
	}
	return false
}

// slicesFor returns the node's slices with only the devices the claims can
// select and the allocated ones.
func (p *placer) slicesFor(ctx context.Context, sn *placeNode, claims []*resourceapi.ResourceClaim) []*resourceapi.ResourceSlice {
	if p.exact {
		return p.allSlices(sn)
	}
	shapes := make([]*claimShape, len(claims))
	sig := ""
	for i, cl := range claims {
		shapes[i] = p.shapeOf(cl)
		sig += shapes[i].selSig + "\x03"
	}
	mask, ok := sn.masks[sig]
	if !ok {
		p.nodeIndex(sn)
		mask = make([][]bool, len(sn.slices))
		for i, s := range sn.slices {
			for j := range s.Spec.Devices {
				mask[i] = append(mask[i], p.selectable(ctx, shapes, sn, devPos{i, j}))
			}
		}
		sn.masks[sig] = mask
		p.cache.entries++
	}
	out := make([]*resourceapi.ResourceSlice, len(sn.slices))
	for i, s := range sn.slices {
		pos := make([]int, 0, len(s.Spec.Devices))
		for j, d := range s.Spec.Devices {
			if mask[i][j] || sn.held[structured.MakeDeviceID(s.Spec.Driver, s.Spec.Pool.Name, d.Name)] > 0 {
				pos = append(pos, j)
			}
		}
		if len(pos) == len(s.Spec.Devices) {
			out[i] = p.allSlices(sn)[i]
			continue
		}
		out[i] = p.attrs.Subset(s, pos)
	}
	return out
}

// selectorsFail says whether a CEL selector of the claims (of a request,
// a subrequest or their device classes) fails to compile or to evaluate
// on some device of the node. The allocator then reports an error as soon
// as it meets such a device before it finds a solution (kube-scheduler
// gives up on the pod for it), so the shortcuts, which evaluate fewer
// devices or none, could answer where the allocator fails: such claims go
// to the exact call. Once per node and claims' selector signature.
func (p *placer) selectorsFail(ctx context.Context, sn *placeNode, claims []*resourceapi.ResourceClaim) bool {
	shapes := make([]*claimShape, len(claims))
	sig := ""
	for i, cl := range claims {
		shapes[i] = p.shapeOf(cl)
		sig += shapes[i].selSig + "\x03"
	}
	if v, ok := sn.failSigs[sig]; ok {
		return v
	}
	p.nodeIndex(sn)
	fail := false
	check := func(expr string) {
		if !fail {
			p.selects(ctx, sn, expr)
			fail = sn.failing[expr]
		}
	}
	for _, s := range shapes {
		for _, a := range s.alts {
			if class, err := p.classes.Get(a.class); err == nil {
				for _, sel := range class.Spec.Selectors {
					if sel.CEL != nil {
						check(sel.CEL.Expression)
					}
				}
			}
			for _, expr := range a.selectors {
				check(expr)
			}
		}
	}
	sn.failSigs[sig] = fail
	p.cache.entries++
	return fail
}
