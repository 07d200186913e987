package prepare

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/node/cdispec"
	"github.com/tessera-dev/tessera/pkg/node/checkpoint"
	"github.com/tessera-dev/tessera/pkg/node/interposercache"
	"github.com/tessera-dev/tessera/pkg/node/mig"
)

// ClaimGetter reads one ResourceClaim from the API server; only used to
// repair lost records. A claim that does not exist is a NotFound error.
type ClaimGetter func(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error)

// Recover brings the records and the node in line after a (re)start,
// before the plugin serves:
//   - records of this boot that completed are kept, and a spec or
//     accounting directory that went missing is restored;
//   - records still in PrepareStarted are rolled back: the kubelet never
//     saw their result and will prepare again;
//   - records from an earlier boot are dropped with their spec and
//     accounting directory (MIG instances and time slices do not survive a
//     reboot, so they are forgotten, not destroyed);
//   - corrupt records are moved aside, and together with specs and
//     accounting directories that no record explains, repaired from the API
//     server: a claim still allocated to this node and reserved is prepared
//     again (adopting its MIG instance); anything else is removed.
//
// A claim waiting for its repair keeps what its CDI spec says it holds (the
// spec records the claim's name and its reservation): until the repair
// settles it, no other claim is prepared on its devices, share, time slice
// or MIG instance. Each repair reads its claim by the namespace and name
// the spec records, never the whole cluster; a claim whose spec is gone too
// (nothing records its name) waits for the kubelet, which prepares it again
// or unprepares it by name.
//
// Only an unusable checkpoint directory is an error. When the API server
// cannot be reached, repairs are left pending for RunRepairs, and for a
// prepare that collides with them. During a seamless upgrade it holds the
// lock shared with the other plugin process, so it never mistakes that
// process's work for leftovers.
func (p *Preparer) Recover(ctx context.Context) error {
	release, err := p.Exclusive()
	if err != nil {
		return err
	}
	defer release()
	if err := p.recoverLocked(ctx); err != nil {
		return err
	}
	return p.PublishShared()
}

func (p *Preparer) recoverLocked(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	token, err := p.readGeneration()
	if err != nil {
		return err
	}
	loaded, err := p.opts.Checkpoints.Load()
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.generation = token
	p.mu.Unlock()
	var live []checkpoint.Newer
	for _, n := range loaded.Newer {
		if !n.Stale {
			live = append(live, n)
			continue
		}
		// Of an earlier boot: what it describes did not survive, so it
		// goes like a stale record of this plugin's format.
		err := p.removeFiles(n.UID, "", "")
		if err == nil {
			err = p.opts.Checkpoints.DeleteStale(n.UID)
			p.changed()
		}
		if err != nil {
			logger.Error(err, "Could not remove the record (in a newer format) of a claim prepared before the node rebooted", "uid", n.UID)
			live = append(live, n)
			continue
		}
		logger.Info("Dropped claim prepared before the node rebooted (its record was in a newer format)", "uid", n.UID, "formatVersion", n.Err.FormatVersion)
	}
	p.setNewer(ctx, live)
	var started []*checkpoint.Claim
	for _, c := range loaded.Claims {
		if c.State == checkpoint.PrepareStarted {
			started = append(started, c)
			continue
		}
		p.restore(ctx, c)
	}
	for _, c := range started {
		p.update(c)
		if err := p.undo(ctx, c, false); err != nil {
			logger.Error(err, "Could not roll back an interrupted prepare; retrying on the next start or unprepare", "claim", klog.KRef(c.Namespace, c.Name), "uid", c.UID)
			continue
		}
		logger.Info("Rolled back interrupted prepare", "claim", klog.KRef(c.Namespace, c.Name), "uid", c.UID)
	}
	for _, c := range loaded.Stale {
		err := p.removeFiles(c.UID, c.SpecName, c.AccountingDir)
		if err == nil {
			err = p.opts.Checkpoints.Delete(c.UID)
			p.changed()
		}
		if err != nil {
			logger.Error(err, "Could not remove the record of a claim prepared before the node rebooted", "uid", c.UID)
			continue
		}
		logger.Info("Dropped claim prepared before the node rebooted", "claim", klog.KRef(c.Namespace, c.Name), "uid", c.UID)
	}
	pending := map[string]string{}
	for _, c := range loaded.Corrupt {
		aside, err := p.opts.Checkpoints.Quarantine(c.UID)
		p.changed()
		if err != nil {
			logger.Error(err, "Could not move a corrupt checkpoint aside", "path", c.Path)
		}
		logger.Info("Checkpoint of claim is corrupt; moved it aside and rebuilding it from the API server and the CDI spec on disk", "uid", c.UID, "error", c.Err.Error(), "movedTo", aside)
		pending[c.UID] = "corrupt checkpoint"
	}
	if err := p.opts.CDI.RemoveTemporary(); err != nil {
		logger.Error(err, "Could not remove temporary files of interrupted CDI spec writes")
	}
	orphans, err := p.orphans()
	if err != nil {
		logger.Error(err, "Could not look for leftovers of earlier runs")
	}
	for uid, what := range orphans {
		if _, ok := pending[uid]; !ok {
			pending[uid] = what
		}
	}
	provisional := map[string]*checkpoint.Claim{}
	for uid := range pending {
		if c := p.reservationFromSpec(ctx, uid); c != nil {
			provisional[uid] = c
			p.restoreTimeSlices(c)
			logger.Info("Holding the devices of a claim that lost its checkpoint until it is repaired", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid, "devices", len(c.Devices))
		}
	}
	p.mu.Lock()
	p.pending = pending
	p.provisional = provisional
	p.mu.Unlock()
	if len(pending) > 0 {
		p.repairPending(ctx)
	}
	if p.handleUnownedMIG(ctx) && p.opts.MIGChanged != nil {
		p.opts.MIGChanged()
	}
	return nil
}

// restoreTimeSlices makes a claim a holder of the intervals its devices
// require again, without setting anything (the GPU kept its interval).
func (p *Preparer) restoreTimeSlices(c *checkpoint.Claim) {
	for _, d := range c.Devices {
		if d.TimeSliceInterval != "" {
			p.opts.TimeSlice.Restore(d.GPUUUID, p.holder(c), v1alpha1.TimeSliceInterval(d.TimeSliceInterval))
		}
	}
}

// reservationFromSpec rebuilds what a claim without a record holds from
// its CDI spec on disk: the claim's name and its reservation, which
// buildSpec records in the spec's annotations. It returns nil when there
// is no spec or the spec does not name its claim.
func (p *Preparer) reservationFromSpec(ctx context.Context, uid string) *checkpoint.Claim {
	name := cdispec.SpecName(uid)
	spec, err := p.opts.CDI.Read(name)
	if err != nil {
		return nil
	}
	ns, claimName, ok := strings.Cut(spec.Annotations[cdispec.AnnotationClaim], "/")
	if !ok || ns == "" || claimName == "" {
		return nil
	}
	c := &checkpoint.Claim{UID: uid, Namespace: ns, Name: claimName, SpecName: name}
	if raw := spec.Annotations[cdispec.AnnotationReservation]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &c.Devices); err == nil {
			return c
		}
		klog.FromContext(ctx).Error(err, "CDI spec records its reservation unreadably; holding its devices whole", "spec", name)
	}
	// A spec without a readable reservation (written before it was
	// recorded): hold each of its devices whole, which is never less than
	// the claim held.
	inv, devices := p.model()
	for _, d := range spec.Devices {
		// Device names are <uid>-<device>[-<share ID>] (cdispec.DeviceName);
		// the longest published name that fits is the device.
		var device, share string
		for published := range devices {
			rest, ok := strings.CutPrefix(d.Name, uid+"-"+published)
			if ok && (rest == "" || strings.HasPrefix(rest, "-")) && len(published) > len(device) {
				device, share = published, strings.TrimPrefix(rest, "-")
			}
		}
		name, err := devicemodel.ParseName(device)
		if err != nil || inv == nil {
			continue
		}
		rd := checkpoint.Device{Device: device, ShareID: share, Type: name.Type}
		for _, gpu := range inv.GPUs {
			if gpu.Index == name.Index {
				rd.GPUUUID = gpu.UUID
			}
		}
		if q, ok := devices[device].Capacity[devicemodel.CapMemory]; ok {
			rd.Memory = uint64(q.Value.Value())
		}
		c.Devices = append(c.Devices, rd)
	}
	return c
}

// restore takes a completed record of this boot back into service.
func (p *Preparer) restore(ctx context.Context, c *checkpoint.Claim) {
	logger := klog.FromContext(ctx)
	p.update(c)
	p.restoreTimeSlices(c)
	if c.Spec != nil && !p.opts.CDI.Exists(c.SpecName) {
		if err := p.opts.CDI.Write(c.SpecName, c.Spec); err != nil {
			logger.Error(err, "Could not restore the CDI spec of a prepared claim", "claim", klog.KRef(c.Namespace, c.Name))
		} else {
			logger.Info("Restored missing CDI spec of prepared claim", "claim", klog.KRef(c.Namespace, c.Name), "spec", c.SpecName)
		}
	}
	if err := p.ensurePreloadFile(ctx, c); err != nil {
		logger.Error(err, "Could not restore the ld.so.preload of a prepared claim", "claim", klog.KRef(c.Namespace, c.Name))
	}
	if c.MPS != nil && p.opts.MPS != nil && !p.opts.MPS.Running(ctx, c.UID) {
		// The daemon did not survive (a node daemon restart, a plugin
		// container restart): start it again with the recorded limits.
		if _, err := p.opts.MPS.Start(ctx, c.UID, mpsLimits(c.MPS)); err != nil {
			logger.Error(err, "Could not restart the MPS daemon of a prepared claim", "claim", klog.KRef(c.Namespace, c.Name))
		} else {
			logger.Info("Restarted the MPS daemon of a prepared claim", "claim", klog.KRef(c.Namespace, c.Name))
		}
	}
	if c.AccountingDir != "" {
		// A plugin restart keeps the claim's tmpfs (and the accounting
		// file the containers share); one that went missing is made again.
		d := p.accounting()
		d.Root = filepath.Dir(c.AccountingDir)
		if err := d.Ensure(ctx, filepath.Base(c.AccountingDir)); err != nil {
			logger.Error(err, "Could not restore the accounting directory of a prepared claim", "claim", klog.KRef(c.Namespace, c.Name))
		}
	}
}

// orphans returns the claims with a spec or accounting directory but no
// record.
func (p *Preparer) orphans() (map[string]string, error) {
	out := map[string]string{}
	uids, err := p.opts.CDI.ClaimUIDs()
	if err != nil {
		return out, err
	}
	for _, uid := range uids {
		if p.record(uid) == nil && !p.isNewer(uid) {
			out[uid] = "CDI spec without checkpoint"
		}
	}
	entries, err := os.ReadDir(p.opts.AccountingDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return out, err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			// interposercache.Dirs.Probe's directory, not a claim's.
			continue
		}
		if _, ok := out[e.Name()]; !ok && p.record(e.Name()) == nil && !p.isNewer(e.Name()) {
			out[e.Name()] = "accounting directory without checkpoint"
		}
	}
	entries, err = os.ReadDir(p.claimFilesRoot())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return out, err
	}
	for _, e := range entries {
		if _, ok := out[e.Name()]; !ok && e.IsDir() && p.record(e.Name()) == nil && !p.isNewer(e.Name()) {
			out[e.Name()] = "claim files without checkpoint"
		}
	}
	if p.opts.MPS != nil {
		entries, err := os.ReadDir(p.opts.MPS.Dir())
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return out, err
		}
		for _, e := range entries {
			if _, ok := out[e.Name()]; !ok && p.record(e.Name()) == nil && !p.isNewer(e.Name()) {
				out[e.Name()] = "MPS daemon without checkpoint"
			}
		}
	}
	return out, nil
}

// Pending returns the claims whose repair waits for the API server.
func (p *Preparer) Pending() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.pending))
}

// RunRepairs retries pending repairs every interval until none are left
// or ctx ends.
func (p *Preparer) RunRepairs(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for len(p.Pending()) > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.repair(ctx)
	}
}

// repair is one pass of RunRepairs: outside kubelet calls, so it takes
// the lock shared with another plugin process and that process's changes
// into account (see shared.go).
func (p *Preparer) repair(ctx context.Context) {
	logger := klog.FromContext(ctx)
	release, err := p.Exclusive()
	if err != nil {
		logger.Error(err, "Cannot take the plugin's lock to repair lost checkpoints; retrying later")
		return
	}
	defer release()
	if err := p.SyncShared(ctx); err != nil {
		logger.Error(err, "Cannot reload prepared claims; retrying the repairs later")
		return
	}
	p.repairPending(ctx)
	if err := p.PublishShared(); err != nil {
		logger.Error(err, "Cannot record the repairs for the other plugin process")
	}
}

func (p *Preparer) repairPending(ctx context.Context) {
	for _, uid := range p.Pending() {
		p.repairOne(ctx, uid)
	}
}

func (p *Preparer) isPending(uid string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.pending[uid]
	return ok
}

// settle ends a claim's wait for its repair and drops its provisional
// reservation (the caller recorded, or removed, what it holds).
func (p *Preparer) settle(uid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.pending, uid)
	delete(p.provisional, uid)
}

// isNewer says whether a claim's record is in a newer checkpoint format.
func (p *Preparer) isNewer(uid string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.newer[uid]
	return ok
}

// repairOne settles a claim that lost its record, reading it from the API
// server by the name its spec recorded: prepared again when it is still
// allocated here and reserved, its leftovers removed when it is not. It
// stays pending when the API server does not answer or no name is known.
func (p *Preparer) repairOne(ctx context.Context, uid string) {
	logger := klog.FromContext(ctx)
	unlock := p.locks.Lock(uid)
	defer unlock()
	p.mu.Lock()
	why, ok := p.pending[uid]
	held := p.provisional[uid]
	p.mu.Unlock()
	if !ok {
		return
	}
	done := func() { p.settle(uid) }
	if p.record(uid) != nil {
		// Prepared again by the kubelet meanwhile.
		done()
		return
	}
	var claim *resourceapi.ResourceClaim
	if held != nil {
		if p.opts.GetClaim == nil {
			return
		}
		got, err := p.opts.GetClaim(ctx, held.Namespace, held.Name)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			logger.Error(err, "Cannot read a claim to repair its lost checkpoint; retrying later", "claim", klog.KRef(held.Namespace, held.Name), "uid", uid)
			return
		case string(got.UID) == uid:
			claim = got
		}
	} else if !p.hasSpec(uid) {
		// Nothing records the claim's name: the kubelet settles it, by
		// preparing it again or unpreparing it by name.
		logger.V(2).Info("Claim without record or spec waits for the kubelet", "uid", uid, "reason", why)
		return
	}
	if claim != nil && p.inUseHere(claim) {
		if _, err := p.prepareLocked(ctx, claim, true); err != nil {
			logger.Error(err, "Could not rebuild the checkpoint of a claim from the API server", "claim", klog.KObj(claim), "reason", why)
			return
		}
		logger.Info("Repaired checkpoint of claim from the API server", "claim", klog.KObj(claim), "uid", uid, "reason", why)
		done()
		return
	}
	if err := p.removeLeftovers(ctx, uid); err != nil {
		logger.Error(err, "Could not remove the leftovers of a claim", "uid", uid, "reason", why)
		return
	}
	logger.Info("Removed leftovers of a claim that is no longer prepared on this node", "uid", uid, "reason", why)
	done()
}

// inUseHere says whether a claim is allocated to this node's pool by our
// driver and reserved for a consumer.
func (p *Preparer) inUseHere(claim *resourceapi.ResourceClaim) bool {
	if len(claim.Status.ReservedFor) == 0 {
		return false
	}
	for _, r := range ourResults(claim, p.opts.DriverName) {
		if r.Pool == p.opts.NodeName {
			return true
		}
	}
	return false
}

// removeLeftovers removes what a claim without a record may have left:
// the MIG instances its spec on disk says were created for it, the spec
// and the accounting directory.
func (p *Preparer) removeLeftovers(ctx context.Context, uid string) error {
	name := cdispec.SpecName(uid)
	if spec, err := p.opts.CDI.Read(name); err == nil {
		if raw := spec.Annotations[cdispec.AnnotationMIGInstances]; raw != "" {
			var insts []mig.Instance
			if err := json.Unmarshal([]byte(raw), &insts); err != nil {
				klog.FromContext(ctx).Error(err, "CDI spec lists MIG instances unreadably; leaving them", "spec", name)
			}
			for _, inst := range insts {
				if !inst.Created {
					continue
				}
				if err := p.destroyMIG(ctx, uid, inst); err != nil {
					return err
				}
				klog.FromContext(ctx).Info("Destroyed MIG device of a claim without checkpoint", "uid", uid, "instance", inst.String())
			}
		}
	}
	if err := p.removeFiles(uid, name, ""); err != nil {
		return err
	}
	p.mu.Lock()
	held := p.provisional[uid]
	p.mu.Unlock()
	if held != nil {
		released := map[string]bool{}
		for _, d := range held.Devices {
			if d.TimeSliceInterval == "" || released[d.GPUUUID] {
				continue
			}
			released[d.GPUUUID] = true
			if err := p.opts.TimeSlice.Release(ctx, d.GPUUUID, uid); err != nil {
				return err
			}
		}
	}
	p.settle(uid)
	return nil
}

// hasSpec says whether a claim's spec is on disk.
func (p *Preparer) hasSpec(uid string) bool {
	return p.opts.CDI.Exists(cdispec.SpecName(uid))
}

func (p *Preparer) removeFiles(uid, specName, accountingDir string) error {
	if specName == "" {
		specName = cdispec.SpecName(uid)
	}
	if err := p.opts.CDI.Remove(specName); err != nil {
		return err
	}
	if accountingDir == "" {
		accountingDir = p.accountingDir(uid)
	}
	if err := interposercache.RemoveDir(context.Background(), accountingDir); err != nil {
		return err
	}
	if err := p.removeClaimFiles(uid, ""); err != nil {
		return err
	}
	if p.opts.MPS != nil {
		return p.opts.MPS.Stop(context.Background(), uid)
	}
	return nil
}
