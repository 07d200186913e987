package prepare

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/node/checkpoint"
	"github.com/tessera-dev/tessera/pkg/node/timeslice"
)

// reserve checks the plan against every other claim on the node and
// records it (in memory) so that concurrent prepares see it. When the plan
// collides with the provisional reservation of a claim whose record was
// lost, that claim is repaired first (read from the API server by name)
// and the check repeated: a claim that is gone frees its devices, one
// still in use keeps them and this prepare fails.
func (p *Preparer) reserve(ctx context.Context, pl *plan) error {
	blocking, err := p.reserveLocked(pl)
	if blocking == "" {
		return err
	}
	p.repairOne(ctx, blocking)
	_, err = p.reserveLocked(pl)
	return err
}

// reserveLocked is reserve's check; blocking is the provisional claim that
// the plan collided with, if that was the reason it failed.
func (p *Preparer) reserveLocked(pl *plan) (blocking string, _ error) {
	_, devices := p.model()
	p.mu.Lock()
	defer p.mu.Unlock()
	uid := pl.record.UID
	type use struct {
		claim  *checkpoint.Claim
		memory uint64
		share  string
	}
	byDevice := map[string][]use{}
	byGPU := map[string]map[string]*checkpoint.Claim{} // GPU UUID -> device type -> claim
	for _, c := range p.holdersLocked() {
		if c.UID == uid {
			continue
		}
		for _, d := range c.Devices {
			byDevice[d.Device] = append(byDevice[d.Device], use{claim: c, memory: d.Memory, share: d.ShareID})
			if byGPU[d.GPUUUID] == nil {
				byGPU[d.GPUUUID] = map[string]*checkpoint.Claim{}
			}
			byGPU[d.GPUUUID][d.Type] = c
		}
	}
	ref := func(c *checkpoint.Claim) string { return fmt.Sprintf("%s/%s (%s)", c.Namespace, c.Name, c.UID) }
	// fail names the claim in the way; one that lost its record is
	// reported as such, for reserve to repair.
	fail := func(c *checkpoint.Claim, err error) (string, error) {
		if c != nil && p.provisional[c.UID] == c {
			return c.UID, fmt.Errorf("%w; claim %s lost its checkpoint and its repair waits for the API server", err, ref(c))
		}
		return "", err
	}
	mine := map[string]uint64{}
	for _, d := range pl.devices {
		if d.result.AdminAccess != nil && *d.result.AdminAccess {
			continue
		}
		dev := d.result.Device
		uses := byDevice[dev]
		switch d.name.Type {
		case devicemodel.TypeGPU:
			capacity := uint64(0)
			if pub, ok := devices[dev]; ok {
				q := pub.Capacity[devicemodel.CapMemory].Value
				capacity = uint64(q.Value())
			}
			total := mine[dev] + d.alloc.Memory
			for _, u := range uses {
				total += u.memory
				if d.result.ShareID != nil && u.share == string(*d.result.ShareID) {
					return fail(u.claim, fmt.Errorf("device %s share %s is already prepared for claim %s", dev, u.share, ref(u.claim)))
				}
			}
			if total > capacity {
				var others []string
				for _, u := range uses {
					others = append(others, ref(u.claim))
				}
				sort.Strings(others)
				if len(others) > 3 {
					others = append(others[:3], fmt.Sprintf("and %d more", len(others)-3))
				}
				var lost *checkpoint.Claim
				for _, u := range uses {
					if p.provisional[u.claim.UID] == u.claim {
						lost = u.claim
					}
				}
				return fail(lost, fmt.Errorf("device %s would be oversubscribed: %d bytes prepared for claims %s plus %d bytes for this claim exceed its %d bytes; refusing to prepare",
					dev, total-mine[dev]-d.alloc.Memory, strings.Join(others, ", "), d.alloc.Memory, capacity))
			}
			mine[dev] += d.alloc.Memory
			if c := byGPU[d.gpu.UUID][devicemodel.TypeTimeSlice]; c != nil {
				return fail(c, fmt.Errorf("GPU %d is time-sliced for claim %s; a share of %s cannot be prepared next to it", d.gpu.Index, ref(c), dev))
			}
		case devicemodel.TypeTimeSlice:
			if len(uses) > 0 {
				return fail(uses[0].claim, fmt.Errorf("device %s is already prepared for claim %s; refusing to prepare it for a second claim", dev, ref(uses[0].claim)))
			}
			if c := byGPU[d.gpu.UUID][devicemodel.TypeGPU]; c != nil {
				return fail(c, fmt.Errorf("GPU %d carries a share for claim %s; time slice %s cannot be prepared next to it", d.gpu.Index, ref(c), dev))
			}
		case devicemodel.TypeMIG:
			if len(uses) > 0 {
				return fail(uses[0].claim, fmt.Errorf("device %s is already prepared for claim %s; refusing to prepare it for a second claim", dev, ref(uses[0].claim)))
			}
		}
		if d.interval != "" {
			if err := p.opts.TimeSlice.Check(d.gpu.UUID, p.holder(pl.record), d.interval); err != nil {
				for _, c := range p.provisional {
					if c.UID != uid && byGPU[d.gpu.UUID][devicemodel.TypeTimeSlice] == c {
						return fail(c, err)
					}
				}
				return "", err
			}
		}
	}
	p.claims[uid] = clone(pl.record)
	return "", nil
}

// holdersLocked returns every claim that holds devices on the node: the
// records and the provisional reservations of claims waiting for repair.
// The caller holds p.mu.
func (p *Preparer) holdersLocked() []*checkpoint.Claim {
	out := make([]*checkpoint.Claim, 0, len(p.claims)+len(p.provisional))
	for _, c := range p.claims {
		out = append(out, c)
	}
	for uid, c := range p.provisional {
		if p.claims[uid] == nil {
			out = append(out, c)
		}
	}
	for uid, c := range p.newer {
		if p.claims[uid] == nil && p.provisional[uid] == nil {
			out = append(out, c)
		}
	}
	return out
}

// holder is a claim as the holder of a GPU's time slice.
func (p *Preparer) holder(c *checkpoint.Claim) timeslice.Holder {
	return timeslice.Holder{UID: c.UID, Name: c.Namespace + "/" + c.Name}
}
