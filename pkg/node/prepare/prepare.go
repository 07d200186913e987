// Package prepare turns allocated ResourceClaims into per-claim CDI specs
// and undoes that again: the heart of the kubelet plugin's
// NodePrepareResources and NodeUnprepareResources.
//
// Prepare is idempotent (the kubelet retries), safe against crashes at any
// point (see package checkpoint and Recover) and concurrent: claims are
// prepared in parallel, calls for one claim are serialized, and a device
// is never handed to two claims that cannot share it.
package prepare

import (
	"context"
	"fmt"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/keymutex"
	"github.com/tessera-dev/tessera/pkg/node/cdispec"
	"github.com/tessera-dev/tessera/pkg/node/checkpoint"
	"github.com/tessera-dev/tessera/pkg/node/interposercache"
)

// Preparer prepares and unprepares claims.
type Preparer struct {
	opts  Options
	locks keymutex.Mutex

	mu sync.Mutex
	// claims are the records of claims that are prepared or being
	// prepared, by UID.
	claims map[string]*checkpoint.Claim
	// pending are claims whose lost record waits for the API server to be
	// repaired, with the reason.
	pending map[string]string
	// provisional are the reservations of pending claims, rebuilt from
	// their CDI specs: until a repair settles a claim, what it held counts
	// as taken (see Recover).
	provisional map[string]*checkpoint.Claim
	// newer are the claims whose records are in a checkpoint format newer
	// than this plugin reads (written by a newer plugin during a seamless
	// upgrade or before a downgrade), with what their CDI specs say they
	// hold: kept untouched, their devices held, their prepare and
	// unprepare refused (the newer plugin must do them).
	newer    map[string]*checkpoint.Claim
	newerErr map[string]*checkpoint.NewerError
	// generation is the shared-state token this process last saw or
	// wrote; dirty says it changed records since (see shared.go).
	generation string
	dirty      bool

	modelMu  sync.Mutex
	modelInv *inventory.Inventory
	devices  map[string]resourceapi.Device
}

// New returns a Preparer. Call Recover before serving.
func New(opts Options) *Preparer {
	return &Preparer{opts: opts, claims: map[string]*checkpoint.Claim{}, provisional: map[string]*checkpoint.Claim{}, newer: map[string]*checkpoint.Claim{}}
}

// model returns the inventory and its published devices by name, rebuilt
// when the inventory changes.
func (p *Preparer) model() (*inventory.Inventory, map[string]resourceapi.Device) {
	inv, cfg := p.opts.Model()
	p.modelMu.Lock()
	defer p.modelMu.Unlock()
	if inv == nil {
		return nil, nil
	}
	if inv != p.modelInv {
		cfg.Taints = nil
		devices := map[string]resourceapi.Device{}
		if slices, err := devicemodel.Build(inv, cfg); err == nil {
			for _, s := range slices {
				for _, d := range s.Devices {
					devices[d.Name] = d
				}
			}
		}
		p.modelInv, p.devices = inv, devices
	}
	return p.modelInv, p.devices
}

// Prepare prepares one claim: the CDI devices to hand to the runtime, or
// an error for this claim alone.
func (p *Preparer) Prepare(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	uid := string(claim.UID)
	unlock := p.locks.Lock(uid)
	defer unlock()
	if err := p.refuseNewer(uid); err != nil {
		return nil, err
	}
	// A claim whose record was lost is prepared as a repair: what its
	// spec says was made for it (a MIG instance) is adopted, not refused.
	repair := p.isPending(uid)
	devices, err := p.prepareLocked(ctx, claim, repair)
	if err == nil && repair {
		p.settle(uid)
	}
	return devices, err
}

// prepareLocked is Prepare with the claim's lock held: a claim prepared
// for the same allocation is returned as it is (its spec and preload
// file restored, a new consumer recorded), one prepared otherwise is
// undone first; then the plan is reserved, applied and published.
func (p *Preparer) prepareLocked(ctx context.Context, claim *resourceapi.ResourceClaim, repair bool) ([]kubeletplugin.Device, error) {
	logger := klog.FromContext(ctx)
	uid := string(claim.UID)
	results := ourResults(claim, p.opts.DriverName)
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	fp := fingerprint(claim, p.opts.DriverName)
	if existing := p.record(uid); existing != nil {
		if existing.State == checkpoint.PrepareCompleted && existing.Fingerprint == fp {
			if pods := consumerPods(claim, existing.Pods); len(pods) != len(existing.Pods) {
				// Prepared again for another consumer of a shared claim.
				updated := clone(existing)
				updated.Pods = pods
				if err := p.put(updated); err != nil {
					return nil, err
				}
			}
			if err := p.ensurePreloadFile(ctx, existing); err != nil {
				return nil, err
			}
			if !p.opts.CDI.Exists(existing.SpecName) && existing.Spec != nil {
				if err := p.opts.CDI.Write(existing.SpecName, existing.Spec); err != nil {
					return nil, err
				}
				logger.Info("Rewrote missing CDI spec of prepared claim", "claim", klog.KObj(claim), "spec", existing.SpecName)
			}
			return kubeletDevices(existing), nil
		}
		logger.Info("Claim was prepared for a different allocation or not completely; undoing that first", "claim", klog.KObj(claim), "state", existing.State)
		if err := p.undo(ctx, existing, true); err != nil {
			return nil, fmt.Errorf("undo earlier preparation: %w", err)
		}
	}
	if len(results) == 0 {
		return nil, nil
	}
	pl, err := p.newPlan(claim, results, fp)
	if err != nil {
		return nil, err
	}
	if err := p.reserve(ctx, pl); err != nil {
		return nil, withReason(ReasonConflict, err)
	}
	if err := p.apply(ctx, pl, repair); err != nil {
		if uerr := p.undo(ctx, pl.record, false); uerr != nil {
			logger.Error(uerr, "Could not undo a failed prepare; the claim's record is kept and the next prepare, unprepare or restart retries", "claim", klog.KObj(claim))
		}
		return nil, err
	}
	if p.opts.Status != nil {
		p.opts.Status.Set(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}, claim.UID, StatusDevices(p.opts.DriverName, pl.record, nil))
	}
	logger.V(2).Info("Prepared claim", "claim", klog.KObj(claim), "devices", len(pl.record.Devices), "spec", pl.record.SpecName)
	return kubeletDevices(pl.record), nil
}

// needsStarted says whether prepare changes anything that cannot be found
// again by the claim's UID (MIG instances, a GPU's time slice). Only then
// is a PrepareStarted record written first; a share's spec and accounting
// directory are named after the claim and found at start if a crash left
// them behind.
func needsStarted(pl *plan) bool {
	for _, d := range pl.devices {
		if d.interval != "" || (d.mig != nil && d.mig.Created) {
			return true
		}
	}
	return false
}

// apply carries out a reserved plan in crash-safe order: MIG devices
// found or their creation recorded, the started record (needsStarted),
// time slices, MIG instances, the CDI spec, the completed record. A
// failure leaves the record for the caller to undo.
func (p *Preparer) apply(ctx context.Context, pl *plan, repair bool) error {
	rec := pl.record
	// MIG: hold the GPUs' MIG locks from the check of the placements to
	// the creation of the instances.
	unlock := p.lockMIGGPUs(pl)
	defer unlock()
	var create []int
	for i := range pl.devices {
		d := &pl.devices[i]
		if d.mig == nil {
			continue
		}
		inst, err := p.findMIG(ctx, rec, i, *d.mig, repair)
		if err != nil {
			return withReason(ReasonMIG, err)
		}
		if inst == nil {
			// To be created: the record carries the intent (profile and
			// placement) before the instance exists, so a crash after
			// the creation finds the instance at the placement and
			// removes it.
			rec.Devices[i].MIG = ptr.To(*d.mig)
			create = append(create, i)
			continue
		}
		p.useMIG(pl, i, inst)
	}
	if needsStarted(pl) {
		if err := p.put(rec); err != nil {
			return err
		}
		p.crash(CrashPrepareStarted)
	}
	for _, d := range pl.devices {
		if d.interval != "" {
			if err := p.opts.TimeSlice.Acquire(ctx, d.gpu.UUID, p.holder(rec), d.interval); err != nil {
				return err
			}
			p.crash(CrashPrepareTimeSlice)
		}
	}
	for _, i := range create {
		inst, err := p.opts.MIG.Create(ctx, *pl.devices[i].mig, nil)
		if err != nil {
			return withReason(ReasonMIG, err)
		}
		p.useMIG(pl, i, inst)
		p.crash(CrashPrepareMIGCreated)
	}
	spec, err := p.buildSpec(ctx, pl)
	if err != nil {
		return err
	}
	if err := p.opts.CDI.Write(rec.SpecName, spec); err != nil {
		return err
	}
	p.crash(CrashPrepareSpec)
	rec.State = checkpoint.PrepareCompleted
	rec.Spec = spec
	if err := p.put(rec); err != nil {
		return err
	}
	p.crash(CrashPrepareCompleted)
	return nil
}

// Unprepare undoes a claim's preparation; an unknown claim is fine.
func (p *Preparer) Unprepare(ctx context.Context, claim types.NamespacedName, uid types.UID) error {
	unlock := p.locks.Lock(string(uid))
	defer unlock()
	if err := p.refuseNewer(string(uid)); err != nil {
		return err
	}
	rec := p.record(string(uid))
	if rec == nil {
		// Nothing recorded: remove what a crash or a lost record may have
		// left, found by the claim's UID.
		return p.removeLeftovers(ctx, string(uid))
	}
	if err := p.undo(ctx, rec, true); err != nil {
		return err
	}
	klog.FromContext(ctx).V(2).Info("Unprepared claim", "claim", claim, "uid", uid)
	return nil
}

// undo removes everything a record says was done, in an order that keeps
// the record meaningful if it is interrupted: the spec first (no new
// container gets the devices), then MIG instances and the time slice, the
// record last.
func (p *Preparer) undo(ctx context.Context, rec *checkpoint.Claim, clearStatus bool) error {
	name := rec.SpecName
	if name == "" {
		name = cdispec.SpecName(rec.UID)
	}
	if err := p.opts.CDI.Remove(name); err != nil {
		return err
	}
	p.crash(CrashUnprepareSpec)
	dir := rec.AccountingDir
	if dir == "" {
		dir = p.accountingDir(rec.UID)
	}
	if err := interposercache.RemoveDir(ctx, dir); err != nil {
		return err
	}
	if err := p.removeClaimFiles(rec.UID, rec.PreloadFile); err != nil {
		return err
	}
	if p.opts.MPS != nil {
		if err := p.opts.MPS.Stop(ctx, rec.UID); err != nil {
			return err
		}
	}
	for _, d := range rec.Devices {
		if d.MIG == nil || !d.MIG.Created {
			continue
		}
		if err := p.destroyMIG(ctx, rec.UID, *d.MIG); err != nil {
			return err
		}
		p.crash(CrashUnprepareMIG)
	}
	released := map[string]bool{}
	for _, d := range rec.Devices {
		if d.TimeSliceInterval == "" || released[d.GPUUUID] {
			continue
		}
		released[d.GPUUUID] = true
		if err := p.opts.TimeSlice.Release(ctx, d.GPUUUID, rec.UID); err != nil {
			return err
		}
		p.crash(CrashUnprepareTimeSlice)
	}
	if err := p.opts.Checkpoints.Delete(rec.UID); err != nil {
		return err
	}
	p.mu.Lock()
	delete(p.claims, rec.UID)
	p.dirty = true
	p.mu.Unlock()
	p.crash(CrashUnprepareDone)
	if clearStatus && p.opts.Status != nil {
		p.opts.Status.Clear(ctx, types.NamespacedName{Namespace: rec.Namespace, Name: rec.Name}, types.UID(rec.UID))
	}
	return nil
}

// kubeletDevices are the devices of a record as the kubelet takes them.
func kubeletDevices(rec *checkpoint.Claim) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(rec.Devices))
	for _, d := range rec.Devices {
		kd := kubeletplugin.Device{
			Requests:     []string{d.Request},
			PoolName:     d.Pool,
			DeviceName:   d.Device,
			CDIDeviceIDs: []string{d.CDIDeviceID},
		}
		if d.ShareID != "" {
			share := types.UID(d.ShareID)
			kd.ShareID = &share
		}
		out = append(out, kd)
	}
	return out
}
