package decide

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/structured"
)

// Remembered failures of the placement shortcuts (shortcut 4 in
// shortcuts.go).

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
