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
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/tessera-dev/tessera/pkg/keymutex"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/atomicfile"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/node/cdispec"
	"github.com/tessera-dev/tessera/pkg/node/checkpoint"
	"github.com/tessera-dev/tessera/pkg/node/driverfiles"
	"github.com/tessera-dev/tessera/pkg/node/enforce"
	"github.com/tessera-dev/tessera/pkg/node/interposercache"
	"github.com/tessera-dev/tessera/pkg/node/mig"
	"github.com/tessera-dev/tessera/pkg/node/mps"
	"github.com/tessera-dev/tessera/pkg/node/timeslice"
)

// StatusWriter publishes what was prepared in the claim's status.devices.
// It must not block: prepare never waits for the API server.
type StatusWriter interface {
	Set(ctx context.Context, claim types.NamespacedName, uid types.UID, devices []resourceapi.AllocatedDeviceStatus)
	Clear(ctx context.Context, claim types.NamespacedName, uid types.UID)
}

// Options wire a Preparer to the node.
type Options struct {
	DriverName string
	// NodeName is the name of this node's pool.
	NodeName    string
	Checkpoints *checkpoint.Store
	CDI         cdispec.Dir
	Nodes       cdispec.DeviceNodes
	// DriverFiles, when set, gives every claim's containers the node's
	// NVIDIA driver files (libraries, binaries, firmware, hooks).
	DriverFiles DriverFiles
	MIG         *mig.Manager
	MIGMode     devicemodel.MIGMode
	// MIGDestroyUnknown destroys, at start, MIG instances on dynamically
	// partitioned GPUs that no record owns (--mig-destroy-unknown).
	MIGDestroyUnknown bool
	// MIGChanged, when set, is called after MIG instances Tessera did not
	// create were destroyed (the publisher rediscovers).
	MIGChanged func()
	TimeSlice  *timeslice.Manager
	Enforce    enforce.Node
	// AccountingDir holds a directory per claim for the interposer's
	// shared accounting file.
	AccountingDir string
	// AccountingSize bounds each claim's accounting tmpfs in bytes (0:
	// interposercache.DefaultSize).
	AccountingSize uint64
	// AccountingUnbounded makes plain directories instead of tmpfs mounts,
	// for a plugin that may not mount.
	AccountingUnbounded bool
	// ClaimFilesDir holds a directory per claim for the files the plugin
	// writes for its containers (the ld.so.preload file of interposer
	// mode), mounted read-only; empty: <checkpoint dir>/../claims.
	ClaimFilesDir string
	// MPS starts one MPS control daemon per claim in mps mode; nil when
	// the node does not (then node daemons, Enforce.MPSPipeDir, serve).
	MPS mps.Daemons
	// Model returns the current inventory and device-model configuration.
	Model  func() (*inventory.Inventory, devicemodel.Config)
	Status StatusWriter
	// GetClaim reads one ResourceClaim from the API server; only used to
	// repair records that were lost (see Recover).
	GetClaim ClaimGetter
	// Crash, when set, is called at named points of prepare and unprepare
	// (crash-injection tests kill the process there).
	Crash func(point string)
	// SharedLock, when set, is the lock file another plugin process shares
	// with this one during a seamless upgrade: the records are then
	// reloaded and published around every call (see shared.go).
	SharedLock string
}

// DriverFiles are the container edits that bring the node's driver into a
// container (see package driverfiles).
type DriverFiles interface {
	Edits(ctx context.Context) (cdispecs.ContainerEdits, error)
}

// Crash points, in the order prepare and unprepare pass them.
const (
	CrashPrepareStarted     = "prepare:started"
	CrashPrepareTimeSlice   = "prepare:timeslice"
	CrashPrepareMIGCreated  = "prepare:mig-created"
	CrashPrepareSpec        = "prepare:spec"
	CrashPrepareCompleted   = "prepare:completed"
	CrashUnprepareSpec      = "unprepare:spec"
	CrashUnprepareMIG       = "unprepare:mig"
	CrashUnprepareTimeSlice = "unprepare:timeslice"
	CrashUnprepareDone      = "unprepare:checkpoint"
)

// CrashPoints lists every crash point.
var CrashPoints = []string{
	CrashPrepareStarted, CrashPrepareTimeSlice, CrashPrepareMIGCreated, CrashPrepareSpec, CrashPrepareCompleted, CrashUnprepareSpec, CrashUnprepareMIG, CrashUnprepareTimeSlice, CrashUnprepareDone,
}

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

func (p *Preparer) crash(point string) {
	if p.opts.Crash != nil {
		p.opts.Crash(point)
	}
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

func (p *Preparer) holder(c *checkpoint.Claim) timeslice.Holder {
	return timeslice.Holder{UID: c.UID, Name: c.Namespace + "/" + c.Name}
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

func (p *Preparer) useMIG(pl *plan, i int, inst *mig.Instance) {
	d := &pl.devices[i]
	d.mig = inst
	d.alloc.UUID = inst.UUID
	pl.record.Devices[i].UUID = inst.UUID
	pl.record.Devices[i].MIG = ptr.To(*inst)
}

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

func (p *Preparer) buildSpec(ctx context.Context, pl *plan) (*cdispecs.Spec, error) {
	rec := pl.record
	res, err := enforce.Plan(p.enforceClaim(pl), p.allocations(pl), p.opts.Enforce, p.accountingDir(rec.UID))
	if err != nil {
		return nil, withReason(ReasonEnforcement, err)
	}
	for i := range rec.Devices {
		for _, v := range res.Visible {
			if v.UUID == rec.Devices[i].UUID {
				rec.Devices[i].Mode, rec.Devices[i].Enforced = string(v.Mode), string(v.Enforced)
				if v.Note != "" {
					klog.FromContext(ctx).Info("Limits of a device are not enforced by the node", "claim", klog.KRef(rec.Namespace, rec.Name), "device", rec.Devices[i].Device, "reason", v.Note)
				}
			}
		}
	}
	if res.AccountingDir != "" {
		// Fresh for every preparation: a stale accounting file would keep
		// the limits of an earlier allocation. A size-limited tmpfs.
		dir, err := p.accounting().Create(ctx, rec.UID)
		if err != nil {
			return nil, err
		}
		rec.AccountingDir = dir
	}
	if res.PreloadFile != "" {
		// Before the spec that mounts it: a runtime that finds the spec
		// finds the file.
		if err := atomicfile.Write(res.PreloadFile, res.PreloadContent, 0o644); err != nil {
			return nil, fmt.Errorf("write the claim's ld.so.preload: %w", err)
		}
		rec.PreloadFile = res.PreloadFile
	}
	if res.MPS != nil {
		// The claim's own daemon, with its limits set on the daemon side,
		// before any container can connect.
		pipe, err := p.opts.MPS.Start(ctx, rec.UID, *res.MPS)
		if err != nil {
			return nil, err
		}
		rec.MPS = mpsRecord(pipe, *res.MPS)
		if l, ok := p.opts.MPS.(mps.Located); ok {
			rec.MPS.Pod = l.Where(rec.UID)
		}
	}
	control, err := p.opts.Nodes.Control()
	if err != nil {
		return nil, err
	}
	claimEdits := cdispecs.ContainerEdits{Env: res.Env, DeviceNodes: control, Mounts: res.Mounts}
	if p.opts.DriverFiles != nil {
		driver, err := p.opts.DriverFiles.Edits(ctx)
		if err != nil {
			return nil, err
		}
		driverfiles.Merge(&claimEdits, driver)
	}
	var devices []cdispecs.Device
	var created []mig.Instance
	for i, d := range pl.devices {
		var nodes []*cdispecs.DeviceNode
		gpuNodes, err := p.opts.Nodes.GPU(d.gpu.Minor)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, gpuNodes...)
		if d.mig != nil {
			caps, err := p.opts.Nodes.MIG(d.gpu.Minor, d.mig.GIID, d.mig.CIID)
			if err != nil {
				return nil, err
			}
			nodes = append(nodes, caps...)
			if d.mig.Created {
				created = append(created, *d.mig)
			}
		}
		rd := rec.Devices[i]
		devices = append(devices, cdispecs.Device{
			Name:           cdispec.DeviceName(rec.UID, rd.Device, rd.ShareID),
			ContainerEdits: cdispecs.ContainerEdits{DeviceNodes: nodes},
		})
	}
	annotations := map[string]string{cdispec.AnnotationClaim: rec.Namespace + "/" + rec.Name}
	reservation, err := json.Marshal(rec.Devices)
	if err != nil {
		return nil, err
	}
	annotations[cdispec.AnnotationReservation] = string(reservation)
	if len(created) > 0 {
		data, _ := json.Marshal(created)
		annotations[cdispec.AnnotationMIGInstances] = string(data)
	}
	return cdispec.NewSpec(claimEdits, devices, annotations)
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

// StatusData is the data a device's entry in status.devices carries.
type StatusData = v1alpha1.DeviceStatus

// StatusDevices are a prepared claim's entries in status.devices, with the
// usage sampled per device (by device name; nil: none yet).
func StatusDevices(driver string, rec *checkpoint.Claim, usage map[string]*v1alpha1.DeviceUsage) []resourceapi.AllocatedDeviceStatus {
	out := make([]resourceapi.AllocatedDeviceStatus, 0, len(rec.Devices))
	for _, d := range rec.Devices {
		cores := d.Cores
		if cores == 0 || d.Enforced == string(enforce.Hard) {
			cores = 100
		}
		data := StatusData{
			UUID: d.UUID, GPUUUID: d.GPUUUID,
			MemoryLimit: *resource.NewQuantity(int64(d.Memory), resource.BinarySI), MemoryLimitBytes: d.Memory,
			ComputeLimit: cores, Enforcement: d.Mode, Enforced: d.Enforced, TimeSliceInterval: d.TimeSliceInterval,
		}
		if d.MIG != nil {
			data.MIGProfile = d.MIG.Profile
		}
		data.Usage = usage[d.Device]
		raw, _ := json.Marshal(data)
		s := resourceapi.AllocatedDeviceStatus{Driver: driver, Pool: d.Pool, Device: d.Device, Data: &runtime.RawExtension{Raw: raw}}
		if d.ShareID != "" {
			share := d.ShareID
			s.ShareID = &share
		}
		out = append(out, s)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Device < out[j].Device })
	return out
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
	out := make([]string, 0, len(p.claims))
	for uid := range p.claims {
		out = append(out, uid)
	}
	sort.Strings(out)
	return out
}

func mpsRecord(pipe string, l mps.Limits) *checkpoint.MPS {
	r := &checkpoint.MPS{PipeDir: pipe, ThreadPercent: l.ThreadPercent}
	for _, d := range l.Devices {
		r.Devices = append(r.Devices, checkpoint.MPSDevice{UUID: d.UUID, MemMiB: d.MemMiB})
	}
	return r
}

func mpsLimits(r *checkpoint.MPS) mps.Limits {
	l := mps.Limits{ThreadPercent: r.ThreadPercent}
	for _, d := range r.Devices {
		l.Devices = append(l.Devices, mps.Device{UUID: d.UUID, MemMiB: d.MemMiB})
	}
	return l
}
