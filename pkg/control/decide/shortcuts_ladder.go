package decide

import (
	"context"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-dev/tessera/pkg/control/allocation"
)

// The ladder of the placement shortcuts (shortcut 3 in shortcuts.go).

// ladderable says whether a request of this mode, count and admin access
// can take the ladder: one device, no admin access.
func ladderable(mode resourceapi.DeviceAllocationMode, count int64, admin *bool) bool {
	return (mode == "" || mode == resourceapi.DeviceAllocationModeExactCount) && count <= 1 && (admin == nil || !*admin)
}

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
				res, err := allocation.Allocate(ctx, p.features, sn.state, p.classes, p.allSlices(sn), p.cel, sn.node, claims)
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
		var pos []int
		for k < len(list) && list[k].slice == i {
			pos = append(pos, list[k].device)
			k++
		}
		var sets []resourceapi.CounterSet
		for _, cs := range s.Spec.SharedCounters {
			if used[cs.Name] {
				sets = append(sets, cs)
			}
		}
		if len(pos) == len(s.Spec.Devices) && len(sets) == len(s.Spec.SharedCounters) {
			out[i] = p.allSlices(sn)[i]
			continue
		}
		c := p.attrs.Subset(s, pos)
		c.Spec.SharedCounters = sets
		out[i] = c
	}
	return out
}
