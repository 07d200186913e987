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

	"github.com/tessera-dev/tessera/pkg/allocation"
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

// exprResults are a CEL expression's results per distinct key of what it
// reads of a device (celRefs.appendKey, or '*' and the device's whole
// content): the keys of its refs' signature, numbered (placeCache.keys).
type exprResults struct {
	refs celRefs
	sig  string
	// results by key number: 0 not evaluated yet, 1 no match, 2 match.
	results []int8
}

// expr returns the expression's results.
func (p *placer) expr(expr string) *exprResults {
	e := p.cache.exprs[expr]
	if e == nil {
		e = &exprResults{refs: analyzeCEL(expr)}
		e.sig = e.refs.sig()
		p.cache.exprs[expr] = e
	}
	return e
}

// keyIDs numbers the node's devices (flat, in slice order) by their keys
// under the signature of e's refs, once per node and signature: the MIG
// selectors of a claim's alternatives all read the same capacity, so they
// share one pass.
func (p *placer) keyIDs(sn *placeNode, e *exprResults) []int32 {
	if ids, ok := sn.keyIDs[e.sig]; ok {
		return ids
	}
	p.nodeIndex(sn)
	space := p.cache.keys[e.sig]
	if space == nil {
		space = map[string]int32{}
		p.cache.keys[e.sig] = space
	}
	ids := make([]int32, 0, sn.devices)
	for i, s := range sn.slices {
		for j := range s.Spec.Devices {
			d := &s.Spec.Devices[j]
			if e.refs.fixed && p.convertible(sn, devPos{i, j}) {
				p.keyBuf = e.refs.appendKey(p.keyBuf[:0], s.Spec.Driver, d)
			} else {
				p.keyBuf = append(append(p.keyBuf[:0], '*'), deviceContentKey(s.Spec.Driver, d)...)
			}
			id, ok := space[string(p.keyBuf)]
			if !ok {
				id = int32(len(space))
				space[string(p.keyBuf)] = id
			}
			ids = append(ids, id)
		}
	}
	sn.keyIDs[e.sig] = ids
	p.cache.entries++
	return ids
}

// matches says whether the expression selects the node's device at pos.
// An expression that does not compile or fails at run time on the device
// selects nothing (as for kube-scheduler, whose allocator reports the
// error and never allocates the device): shortcuts never run for claims
// whose selectors fail on a node (selectorsFail), the exact allocator
// call reports the error instead.
func (p *placer) matches(ctx context.Context, expr string, sn *placeNode, pos devPos) bool {
	e := p.expr(expr)
	return p.result(ctx, expr, e, p.keyIDs(sn, e)[sn.offsets[pos.slice]+pos.device], sn, pos) == celMatch
}

// CEL results as exprResults keeps them.
const (
	celUnknown int8 = iota
	celNoMatch
	celMatch
	celError
)

// result is e's result for key id, evaluated on the node's device at pos
// (which has that key) when not known yet: celMatch, celNoMatch or
// celError (the expression does not compile or fails on the device).
func (p *placer) result(ctx context.Context, expr string, e *exprResults, id int32, sn *placeNode, pos devPos) int8 {
	if n := int(id) + 1; n > len(e.results) {
		e.results = append(e.results, make([]int8, n-len(e.results))...)
	}
	if r := e.results[id]; r != celUnknown {
		return r
	}
	p.celEvaluations++
	s := sn.slices[pos.slice]
	d := &s.Spec.Devices[pos.device]
	r := celError
	if res := p.cel.GetOrCompile(expr); res.Error == nil {
		m, _, err := res.DeviceMatches(ctx, cel.Device{Driver: s.Spec.Driver, AllowMultipleAllocations: d.AllowMultipleAllocations, Attributes: d.Attributes, Capacity: d.Capacity})
		switch {
		case err != nil:
			r = celError
		case m:
			r = celMatch
		default:
			r = celNoMatch
		}
	}
	e.results[id] = r
	return r
}

// convertible says whether CEL can take every attribute of the node's
// device at pos, computed once.
func (p *placer) convertible(sn *placeNode, pos devPos) bool {
	ok, seen := sn.convertible[pos]
	if !seen {
		ok = deviceConvertible(&sn.slices[pos.slice].Spec.Devices[pos.device], p.cache.versions.ok)
		sn.convertible[pos] = ok
	}
	return ok
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
		return sn.slices
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
		if !p.altKnownToFail(sn, a) {
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
	for _, a := range s.alts {
		p.altFailed(sn, a)
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

func ladderable(mode resourceapi.DeviceAllocationMode, count int64, admin *bool) bool {
	return (mode == "" || mode == resourceapi.DeviceAllocationModeExactCount) && count <= 1 && (admin == nil || !*admin)
}

// devPos is a device's place among a node's slices.
type devPos struct{ slice, device int }

// candidates lists, in the allocator's order, the node's devices the
// alternative's class and selectors select.
func (p *placer) candidates(ctx context.Context, sn *placeNode, a alternative) []devPos {
	if c, ok := sn.cands[a.selKey]; ok {
		return c
	}
	var exprs []string
	if class, err := p.classes.Get(a.class); err == nil {
		for _, sel := range class.Spec.Selectors {
			if sel.CEL != nil {
				exprs = append(exprs, sel.CEL.Expression)
			}
		}
	}
	vectors := make([][]bool, 0, len(exprs)+len(a.selectors))
	for _, expr := range append(exprs, a.selectors...) {
		vectors = append(vectors, p.selects(ctx, sn, expr))
	}
	c := []devPos{}
	flat := 0
	for i, s := range sn.slices {
	devices:
		for j := range s.Spec.Devices {
			flat++
			for _, v := range vectors {
				if !v[flat-1] {
					continue devices
				}
			}
			c = append(c, devPos{i, j})
		}
	}
	sn.cands[a.selKey] = c
	p.cache.entries++
	return c
}

// selects says, for every device of the node in the allocator's order,
// whether the expression selects it; once per node and expression, so
// alternatives of the same class share the class's selectors.
func (p *placer) selects(ctx context.Context, sn *placeNode, expr string) []bool {
	if v, ok := sn.vectors[expr]; ok {
		return v
	}
	e := p.expr(expr)
	ids := p.keyIDs(sn, e)
	v := make([]bool, len(ids))
	for i, s := range sn.slices {
		for j := range s.Spec.Devices {
			k := sn.offsets[i] + j
			switch p.result(ctx, expr, e, ids[k], sn, devPos{i, j}) {
			case celMatch:
				v[k] = true
			case celError:
				sn.failing[expr] = true
			}
		}
	}
	sn.vectors[expr] = v
	p.cache.entries++
	return v
}

// nodeIndex computes the node's device IDs, positions and counter sets
// once.
func (p *placer) nodeIndex(sn *placeNode) {
	if sn.positions == nil {
		sn.positions = map[structured.DeviceID]devPos{}
		sn.ids = make([][]structured.DeviceID, len(sn.slices))
		sn.offsets = make([]int, len(sn.slices))
		numbers := map[string]int32{}
		for i, s := range sn.slices {
			sn.offsets[i] = sn.devices
			sn.devices += len(s.Spec.Devices)
			for j := range s.Spec.Devices {
				d := &s.Spec.Devices[j]
				id := structured.MakeDeviceID(s.Spec.Driver, s.Spec.Pool.Name, d.Name)
				sn.ids[i] = append(sn.ids[i], id)
				sn.positions[id] = devPos{i, j}
				var sets []int32
				for _, cc := range d.ConsumesCounters {
					name := s.Spec.Driver + "/" + s.Spec.Pool.Name + "/" + cc.CounterSet
					n, ok := numbers[name]
					if !ok {
						n = int32(len(sn.setNames))
						numbers[name] = n
						sn.setNames = append(sn.setNames, name)
					}
					sets = append(sets, n)
				}
				sn.counterSets = append(sn.counterSets, sets)
			}
		}
	}
	if sn.setVersion == nil {
		sn.setVersion = make([]uint64, len(sn.setNames))
		sn.exclusive = make([]bool, sn.devices)
		for id := range sn.state.AllocatedDevices {
			if pos, ok := sn.positions[id]; ok {
				sn.exclusive[sn.flat(pos)] = true
			}
		}
	}
}

// flat is the device's place in flat per-device vectors.
func (ix *deviceIndex) flat(pos devPos) int { return ix.offsets[pos.slice] + pos.device }

// allocateLadder allocates a one-request claim by its alternatives in
// order, each over a few devices, with the same result as the allocator
// over all of them:
//
//   - alternatives known to fail on the node (see knownToFail) are skipped:
//     the allocator would find nothing for them on any subset of the
//     devices either;
//   - for the first other alternative, the allocator gets a prefix (in its
//     own order) of the devices the alternative selects, and every
//     allocated device that consumes counters of a counter set those
//     devices consume. Whether a device can be allocated depends only on
//     the allocation state, its own capacity and the counters of its
//     counter sets, so it is the same as over all devices, and the
//     allocator's first available device of the prefix is its first
//     overall. A result by this alternative is therefore the result over
//     all devices. Otherwise the prefix grows; once it holds all of the
//     alternative's devices and still yields nothing by it, the
//     alternative fails on the node and the next one is tried.
//
// It returns handled=false when the claim is not of that kind.
func (p *placer) allocateLadder(ctx context.Context, sn *placeNode, claims []*resourceapi.ResourceClaim) (res []resourceapi.AllocationResult, handled bool, err error) {
	if p.exact || len(claims) != 1 {
		return nil, false, nil
	}
	s := p.shapeOf(claims[0])
	if !s.single {
		return nil, false, nil
	}
	for _, a := range s.alts {
		if !a.ladder {
			return nil, false, nil
		}
	}
	p.nodeIndex(sn)
	for _, a := range s.alts {
		if p.altKnownToFail(sn, a) {
			continue
		}
		cands := p.candidates(ctx, sn, a)
		if len(cands) == 0 {
			p.altFailed(sn, a) // nothing here it could take
			continue
		}
		for groups := 1; ; groups *= 2 {
			list, in, all := p.groupPrefix(sn, cands, groups, a.blockID)
			res, err := p.allocateListed(ctx, sn, claims[0], a, cands, list)
			if err != nil {
				// Let the allocator report it as it would over all devices.
				p.calls++
				res, err := allocation.Allocate(ctx, p.features, sn.state, p.classes, sn.slices, p.cel, sn.node, claims)
				return res, true, err
			}
			if res != nil && len(res[0].Devices.Results) == 1 && res[0].Devices.Results[0].Request == a.result {
				r := res[0].Devices.Results[0]
				if all || p.firstAvailable(sn, cands, in, sn.positions[structured.MakeDeviceID(r.Driver, r.Pool, r.Device)], a.blockID) {
					return res, true, nil
				}
				continue
			}
			// Nothing in the list could be allocated for the alternative:
			// its counter sets are blocked for it until they change.
			for pos := range in {
				if cs := sn.counterSets[sn.flat(pos)]; len(cs) == 1 {
					sn.blockedAt[blockKey{a.blockID, cs[0]}] = sn.setVersion[cs[0]] + 1
				}
			}
			if all {
				p.altFailed(sn, a)
				break
			}
		}
	}
	return nil, true, nil
}

// groupPrefix returns the candidates of the first groups (in the
// allocator's order) that may be allocated: a group is the candidates of
// one counter set; those that consume no or several counter sets are one
// more group. Candidates allocated exclusively (the allocator never takes them)
// and those of blocked counter sets are left out. The allocated devices
// that share counter sets with the listed ones are added, since the
// allocator derives counters from them; the list is in the allocator's
// order. in holds the listed candidates; all says whether every candidate
// left in is listed. in is the placer's: valid until its next call.
func (p *placer) groupPrefix(sn *placeNode, cands []devPos, groups int, alt int) (list []devPos, in map[devPos]bool, all bool) {
	if p.inBuf == nil {
		p.inBuf = map[devPos]bool{}
	}
	in = p.inBuf
	clear(in)
	chosen, sets := p.groupBuf[:0], p.setBuf[:0] // few: linear search
	all = true
	for _, pos := range cands {
		if p.unavailable(sn, pos, alt) {
			continue
		}
		if g := groupOf(sn, pos); !slices.Contains(chosen, g) {
			if len(chosen) == groups {
				all = false
				continue
			}
			chosen = append(chosen, g)
		}
		list = append(list, pos)
		in[pos] = true
	}
	for _, pos := range list {
		for _, cs := range sn.counterSets[sn.flat(pos)] {
			if !slices.Contains(sets, cs) {
				sets = append(sets, cs)
			}
		}
	}
	if len(sets) > 0 {
		for id := range sn.held {
			pos, ok := sn.positions[id]
			if !ok || in[pos] {
				continue
			}
			for _, cs := range sn.counterSets[sn.flat(pos)] {
				if slices.Contains(sets, cs) {
					list = append(list, pos)
					break
				}
			}
		}
		slices.SortFunc(list, cmpPos)
	}
	p.groupBuf, p.setBuf = chosen, sets
	return list, in, all
}

func groupOf(sn *placeNode, pos devPos) int32 {
	if cs := sn.counterSets[sn.flat(pos)]; len(cs) == 1 {
		return cs[0]
	}
	return -1 // all others are one group
}

// unavailable says whether the allocator cannot take the candidate for
// the alternative: it is allocated exclusively, or its counter set is
// blocked for the alternative.
func (p *placer) unavailable(sn *placeNode, pos devPos, alt int) bool {
	return sn.exclusive[sn.flat(pos)] || p.blocked(sn, alt, pos)
}

// firstAvailable says whether every candidate before the chosen one that
// was not listed is unavailable, i.e. the allocator over all devices
// would have chosen the same.
func (p *placer) firstAvailable(sn *placeNode, cands []devPos, in map[devPos]bool, chosen devPos, alt int) bool {
	for _, pos := range cands {
		if pos == chosen {
			return true
		}
		if !in[pos] && !p.unavailable(sn, pos, alt) {
			return false
		}
	}
	return false
}

// allocateListed runs the allocator for a one-request claim over the
// listed devices of the node (a prefix of the alternative's candidates and
// the allocated devices that share their counter sets), with the same
// result as the exact call over that list.
//
// The exact call's first choice is the first listed device that the
// alternative selects and that can be allocated: the alternatives before
// it find nothing on the node (allocateLadder skips only those), so none
// on part of it. When every listed device that is not a candidate is
// allocated exclusively (the allocator never takes those), the
// alternative selects every listed device that could be taken, so the
// allocator over the same list with the alternative alone and its class
// and request selectors left out (stripped) chooses the same device
// without evaluating a CEL expression. The exact call over that device
// and the allocated devices of its counter sets then yields the
// allocation result itself (class config included); should it differ, the
// exact call over the whole list decides.
func (p *placer) allocateListed(ctx context.Context, sn *placeNode, claim *resourceapi.ResourceClaim, a alternative, cands, list []devPos) ([]resourceapi.AllocationResult, error) {
	call := func(list []devPos) ([]resourceapi.AllocationResult, error) {
		p.calls++
		return allocation.Allocate(ctx, p.features, sn.state, p.classes, p.subset(sn, list), p.cel, sn.node, []*resourceapi.ResourceClaim{claim})
	}
	if !p.onlyCandidatesFree(sn, cands, list) {
		return call(list)
	}
	p.calls++
	p.strippedCalls++
	res, err := allocation.Allocate(ctx, p.features, sn.state, p.strippedClasses(), p.subset(sn, list), p.cel, sn.node, []*resourceapi.ResourceClaim{p.strippedClaim(claim, a)})
	if err != nil {
		return call(list) // let the exact call report it
	}
	if res == nil {
		return nil, nil // the exact call could take no other device
	}
	if len(claim.Spec.Devices.Config) == 0 {
		// The result holds the request's name, the device and the class's
		// config (kept): the same as the exact call's.
		return res, nil
	}
	// The claim's config may name requests the stripped claim lacks: the
	// exact call over the device found yields the result.
	p.strippedConfirmed++
	r := res[0].Devices.Results[0]
	chosen, ok := sn.positions[structured.MakeDeviceID(r.Driver, r.Pool, r.Device)]
	if !ok {
		return call(list)
	}
	confirm := []devPos{chosen}
	for _, pos := range list {
		if pos != chosen && sharesCounterSet(sn, pos, chosen) {
			confirm = append(confirm, pos)
		}
	}
	slices.SortFunc(confirm, cmpPos)
	got, err := call(confirm)
	if err == nil && got != nil && len(got[0].Devices.Results) == 1 && got[0].Devices.Results[0].Device == r.Device && got[0].Devices.Results[0].Pool == r.Pool {
		return got, nil
	}
	p.strippedMismatches++
	return call(list)
}

// onlyCandidatesFree says whether every listed device that is not one of
// the candidates is allocated exclusively.
func (p *placer) onlyCandidatesFree(sn *placeNode, cands, list []devPos) bool {
	for _, pos := range list {
		if _, found := slices.BinarySearchFunc(cands, pos, cmpPos); found {
			continue
		}
		if !sn.exclusive[sn.flat(pos)] {
			return false
		}
	}
	return true
}

func sharesCounterSet(sn *placeNode, a, b devPos) bool {
	for _, cs := range sn.counterSets[sn.flat(a)] {
		if slices.Contains(sn.counterSets[sn.flat(b)], cs) {
			return true
		}
	}
	return false
}

func cmpPos(a, b devPos) int {
	if a.slice != b.slice {
		return a.slice - b.slice
	}
	return a.device - b.device
}

// strippedClaim is the claim with only the alternative, without its
// selectors; the result names the same request.
func (p *placer) strippedClaim(claim *resourceapi.ResourceClaim, a alternative) *resourceapi.ResourceClaim {
	k := strippedKey{claim, a.result}
	if c, ok := p.stripped[k]; ok {
		return c
	}
	c := claim.DeepCopy()
	r := &c.Spec.Devices.Requests[0]
	if r.Exactly != nil {
		r.Exactly.Selectors = nil
	} else {
		for _, sub := range r.FirstAvailable {
			if r.Name+"/"+sub.Name == a.result {
				sub.Selectors = nil
				r.FirstAvailable = []resourceapi.DeviceSubRequest{sub}
				break
			}
		}
	}
	p.stripped[k] = c
	return c
}

type strippedKey struct {
	claim  *resourceapi.ResourceClaim
	result string
}

// strippedClasses are the device classes without their selectors.
func (p *placer) strippedClasses() allocation.Classes {
	if p.noSelectors == nil {
		p.noSelectors = make(allocation.Classes, len(p.classes))
		for i, c := range p.classes {
			cp := *c
			cp.Spec.Selectors = nil
			p.noSelectors[i] = &cp
		}
	}
	return p.noSelectors
}

// subset returns the node's slices (all of them, so pools stay complete)
// with only the listed devices, and only the counter sets those consume:
// the allocator copies every counter set of a pool on each call, and
// checks only those of the devices it considers.
func (p *placer) subset(sn *placeNode, list []devPos) []*resourceapi.ResourceSlice {
	used := map[string]bool{}
	for _, pos := range list {
		for _, cc := range sn.slices[pos.slice].Spec.Devices[pos.device].ConsumesCounters {
			used[cc.CounterSet] = true
		}
	}
	out := make([]*resourceapi.ResourceSlice, len(sn.slices))
	k := 0
	for i, s := range sn.slices {
		var keep []resourceapi.Device
		for k < len(list) && list[k].slice == i {
			keep = append(keep, s.Spec.Devices[list[k].device])
			k++
		}
		var sets []resourceapi.CounterSet
		for _, cs := range s.Spec.SharedCounters {
			if used[cs.Name] {
				sets = append(sets, cs)
			}
		}
		if len(keep) == len(s.Spec.Devices) && len(sets) == len(s.Spec.SharedCounters) {
			out[i] = s
			continue
		}
		c := *s
		c.Spec.Devices, c.Spec.SharedCounters = keep, sets
		out[i] = &c
	}
	return out
}

// altKnownToFail says whether the alternative, or one it implies, failed
// on the node in its current state.
func (p *placer) altKnownToFail(sn *placeNode, a alternative) bool {
	if sn.altFailsAt != sn.version {
		return false
	}
	return slices.ContainsFunc(sn.altFails[a.key], func(f map[resourceapi.QualifiedName]resource.Quantity) bool { return capsAtLeast(a.caps, f) })
}

// altFailed records that the alternative found no device on the node as
// it is.
func (p *placer) altFailed(sn *placeNode, a alternative) {
	if sn.altFailsAt != sn.version || sn.altFails == nil {
		sn.altFails, sn.altFailsAt = map[string][]map[resourceapi.QualifiedName]resource.Quantity{}, sn.version
	}
	sn.altFails[a.key] = append(sn.altFails[a.key], a.caps)
}

// blockKey is an alternative (with its capacity requests) on a counter
// set: none of the devices of the counter set that the alternative
// selects could be allocated for it when the set was at a version.
type blockKey struct {
	alt        int
	counterSet int32
}

// blocked says whether the device is of a counter set on which the
// alternative found nothing, and the counter set's allocations have not
// changed since. Whether a device that consumes only that counter set can
// be allocated depends on the allocation state of the devices consuming
// it (the device included) and nothing else of the node, so it cannot
// have changed either.
func (p *placer) blocked(sn *placeNode, alt int, pos devPos) bool {
	cs := sn.counterSets[sn.flat(pos)]
	if len(cs) != 1 {
		return false
	}
	v, ok := sn.blockedAt[blockKey{alt, cs[0]}]
	return ok && v == sn.setVersion[cs[0]]+1
}

// changed records an allocation added to or removed from the node, once
// the state has it: the versions of the counter sets its devices consume
// change, and whether each of them is allocated exclusively. Before the
// node's index exists there is nothing to record: nodeIndex reads the
// state.
func (p *placer) changed(sn *placeNode, a *resourceapi.AllocationResult) {
	if sn.setVersion == nil {
		return
	}
	for _, r := range a.Devices.Results {
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if pos, ok := sn.positions[id]; ok {
			f := sn.flat(pos)
			for _, cs := range sn.counterSets[f] {
				sn.setVersion[cs]++
			}
			sn.exclusive[f] = sn.state.AllocatedDevices.Has(id)
		}
	}
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
