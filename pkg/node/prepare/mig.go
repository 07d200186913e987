package prepare

import (
	"context"
	"fmt"
	"slices"
	"sort"

	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/node/checkpoint"
	"github.com/tessera-dev/tessera/pkg/node/mig"
)

// lockMIGGPUs takes the MIG lock of every GPU the plan creates or uses
// MIG devices on, in a fixed order.
func (p *Preparer) lockMIGGPUs(pl *plan) func() {
	var gpus []string
	for _, d := range pl.devices {
		if d.mig != nil && !slices.Contains(gpus, d.mig.GPUUUID) {
			gpus = append(gpus, d.mig.GPUUUID)
		}
	}
	sort.Strings(gpus)
	var unlocks []func()
	for _, g := range gpus {
		unlocks = append(unlocks, p.opts.MIG.Lock(g))
	}
	return func() {
		for i := len(unlocks) - 1; i >= 0; i-- {
			unlocks[i]()
		}
	}
}

// findMIG returns the MIG device of device i of the record when it
// exists and may be used: a static instance, or in a repair the instance
// at the allocated placement. It returns nil when a dynamic instance is
// to be created. The caller holds the GPU's MIG lock.
func (p *Preparer) findMIG(ctx context.Context, rec *checkpoint.Claim, i int, t mig.Instance, repair bool) (*mig.Instance, error) {
	found, err := p.opts.MIG.Find(ctx, t)
	if err != nil {
		return nil, err
	}
	if !t.Created {
		if found == nil || found.UUID == "" {
			return nil, fmt.Errorf("MIG device %s does not exist (any more) on GPU %s", rec.Devices[i].Device, t.GPUUUID)
		}
		found.Created = false
		return found, nil
	}
	if found == nil {
		return nil, nil
	}
	if owner := p.migOwner(rec.UID, *found); owner != nil {
		return nil, fmt.Errorf("MIG placement of %s is used by claim %s/%s (%s)", rec.Devices[i].Device, owner.Namespace, owner.Name, owner.UID)
	}
	if !repair {
		return nil, fmt.Errorf("MIG placement of %s is used by GPU instance %d, which Tessera did not create for any claim; destroy it or run with --mig-mode=static", rec.Devices[i].Device, found.GIID)
	}
	// Repairing a lost record: the scheduler allocated this placement to
	// this claim, so the instance there was made for it.
	found.Created = true
	if err := p.opts.MIG.EnsureCI(ctx, found); err != nil {
		return nil, err
	}
	klog.FromContext(ctx).Info("Adopted MIG device for repaired claim", "claim", klog.KRef(rec.Namespace, rec.Name), "instance", found.String())
	return found, nil
}

// useMIG makes inst the MIG device of device i of the plan and its record.
func (p *Preparer) useMIG(pl *plan, i int, inst *mig.Instance) {
	d := &pl.devices[i]
	d.mig = inst
	d.alloc.UUID = inst.UUID
	pl.record.Devices[i].UUID = inst.UUID
	pl.record.Devices[i].MIG = ptr.To(*inst)
}

// migOwner returns the other claim whose record holds a MIG instance.
func (p *Preparer) migOwner(uid string, inst mig.Instance) *checkpoint.Claim {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.holdersLocked() {
		if c.UID == uid {
			continue
		}
		for _, d := range c.Devices {
			if d.MIG != nil && d.MIG.GPUUUID == inst.GPUUUID && d.MIG.Start == inst.Start && d.MIG.GIProfileID == inst.GIProfileID {
				return c
			}
		}
	}
	return nil
}

// destroyMIG destroys an instance this plugin created. One whose IDs were
// not recorded yet (a crash during creation) is looked up at its
// placement.
func (p *Preparer) destroyMIG(ctx context.Context, uid string, inst mig.Instance) error {
	unlock := p.opts.MIG.Lock(inst.GPUUUID)
	defer unlock()
	if inst.GIID < 0 {
		found, err := p.opts.MIG.Find(ctx, inst)
		if err != nil {
			return err
		}
		if found == nil {
			return nil
		}
		inst.GIID, inst.CIID = found.GIID, found.CIID
	}
	if owner := p.migOwner(uid, inst); owner != nil {
		klog.FromContext(ctx).Info("MIG device is held by another claim; not destroying it", "instance", inst.String(), "owner", klog.KRef(owner.Namespace, owner.Name))
		return nil
	}
	if err := p.opts.MIG.Destroy(ctx, inst); err != nil {
		return fmt.Errorf("destroy %s: %w", inst.String(), err)
	}
	return nil
}

// OwnsMIG says whether a record (a prepared claim, or a prepare that
// recorded its intent before creating) holds the MIG instance of a GPU
// instance profile at a placement. The publisher leaves out the
// placements of instances no record owns (devicemodel.Config.ForeignMIG).
func (p *Preparer) OwnsMIG(gpuUUID string, giProfileID, start int) bool {
	return p.migOwner("", mig.Instance{GPUUUID: gpuUUID, GIProfileID: giProfileID, Start: start}) != nil
}

// handleUnownedMIG deals with MIG instances in dynamic mode that no record
// owns: Tessera did not create them (or lost every trace of doing so).
// With MIGDestroyUnknown they are destroyed, as NVIDIA's DRA driver does;
// otherwise they are left and logged, and the publisher leaves the
// placements they block out of the slices. It reports whether it
// destroyed any.
func (p *Preparer) handleUnownedMIG(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	inv, _ := p.model()
	if inv == nil || p.opts.MIGMode != devicemodel.MIGDynamic {
		return false
	}
	destroyed := false
	for _, gpu := range inv.GPUs {
		if !gpu.MIGEnabled {
			continue
		}
		unlock := p.opts.MIG.Lock(gpu.UUID)
		all, err := p.opts.MIG.List(ctx, gpu.UUID)
		if err != nil {
			unlock()
			logger.Error(err, "Could not list the MIG instances of a GPU", "gpu", gpu.UUID)
			continue
		}
		seen := map[int]bool{}
		for _, inst := range all {
			if seen[inst.GIID] || p.migOwner("", inst) != nil {
				continue
			}
			seen[inst.GIID] = true
			if !p.opts.MIGDestroyUnknown {
				logger.Info("MIG instance on a dynamically partitioned GPU was not created by Tessera; leaving it and publishing none of the placements it blocks (--mig-destroy-unknown removes it)",
					"gpu", gpu.UUID, "gpuInstance", inst.GIID, "giProfileID", inst.GIProfileID, "start", inst.Start, "size", inst.Size)
				continue
			}
			if err := p.opts.MIG.Destroy(ctx, inst); err != nil {
				logger.Error(err, "Could not destroy a MIG instance Tessera did not create; its placements stay unpublished", "gpu", gpu.UUID, "gpuInstance", inst.GIID)
				continue
			}
			destroyed = true
			logger.Info("Destroyed a MIG instance Tessera did not create (--mig-destroy-unknown)", "gpu", gpu.UUID, "gpuInstance", inst.GIID, "giProfileID", inst.GIProfileID, "start", inst.Start)
		}
		unlock()
	}
	return destroyed
}
