package decide

import (
	"context"

	"k8s.io/dynamic-resource-allocation/structured"
)

// Each node's device index for the placement shortcuts: positions,
// counter sets and candidates in the allocator's order.

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
