package prepare

import (
	"maps"
	"slices"
	"sort"

	"github.com/tessera-dev/tessera/pkg/node/checkpoint"
	"github.com/tessera-dev/tessera/pkg/node/mps"
)

// record returns the current record of a claim; nil when there is none.
// It is never changed in place (update).
func (p *Preparer) record(uid string) *checkpoint.Claim {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.claims[uid]
}

// update replaces the in-memory record with a copy of c: records in the
// map are never changed in place, other goroutines read them.
func (p *Preparer) update(c *checkpoint.Claim) {
	snap := clone(c)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.claims[c.UID] = snap
}

// clone copies a record deep enough that the copy can be changed.
func clone(c *checkpoint.Claim) *checkpoint.Claim {
	out := *c
	out.Devices = append([]checkpoint.Device(nil), c.Devices...)
	for i := range out.Devices {
		if m := out.Devices[i].MIG; m != nil {
			cp := *m
			out.Devices[i].MIG = &cp
		}
	}
	out.Pods = append([]checkpoint.Pod(nil), c.Pods...)
	if c.MPS != nil {
		m := *c.MPS
		m.Devices = append([]checkpoint.MPSDevice(nil), c.MPS.Devices...)
		out.MPS = &m
	}
	return &out
}

// put persists the record and makes it current.
func (p *Preparer) put(c *checkpoint.Claim) error {
	if err := p.opts.Checkpoints.Put(c); err != nil {
		return err
	}
	p.update(c)
	p.changed()
	return nil
}

// Claims returns copies of the records of the claims prepared now.
func (p *Preparer) Claims() []*checkpoint.Claim {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*checkpoint.Claim, 0, len(p.claims))
	for _, c := range p.claims {
		if c.State == checkpoint.PrepareCompleted {
			out = append(out, clone(c))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UID < out[j].UID })
	return out
}

// Prepared returns the UIDs of the claims recorded now, sorted.
func (p *Preparer) Prepared() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.claims))
}

// mpsRecord is how a claim's record keeps its MPS daemon: its pipe
// directory and the limits it was started with.
func mpsRecord(pipe string, l mps.Limits) *checkpoint.MPS {
	r := &checkpoint.MPS{PipeDir: pipe, ThreadPercent: l.ThreadPercent}
	for _, d := range l.Devices {
		r.Devices = append(r.Devices, checkpoint.MPSDevice{UUID: d.UUID, MemMiB: d.MemMiB})
	}
	return r
}

// mpsLimits are the limits an MPS record was started with (mpsRecord's
// inverse), to start the daemon again.
func mpsLimits(r *checkpoint.MPS) mps.Limits {
	l := mps.Limits{ThreadPercent: r.ThreadPercent}
	for _, d := range r.Devices {
		l.Devices = append(l.Devices, mps.Device{UUID: d.UUID, MemMiB: d.MemMiB})
	}
	return l
}
