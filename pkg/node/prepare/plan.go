package prepare

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/node/cdispec"
	"github.com/tessera-dev/tessera/pkg/node/checkpoint"
	"github.com/tessera-dev/tessera/pkg/node/enforce"
	"github.com/tessera-dev/tessera/pkg/node/interposercache"
	"github.com/tessera-dev/tessera/pkg/node/mig"
)

// planned is one allocation result of our driver, resolved against the
// node: which GPU, how much memory, which configuration.
type planned struct {
	result resourceapi.DeviceRequestAllocationResult
	name   devicemodel.Name
	gpu    inventory.GPU
	alloc  enforce.Allocation
	// mig is the MIG device to create (dynamic) or use (static).
	mig *mig.Instance
	// interval is the time slice the device's configuration asks for.
	interval v1alpha1.TimeSliceInterval
}

// plan is everything prepare will do for a claim, computed before it
// changes anything.
type plan struct {
	claim   *resourceapi.ResourceClaim
	record  *checkpoint.Claim
	devices []planned
}

// ourResults returns the allocation results of this driver.
func ourResults(claim *resourceapi.ResourceClaim, driver string) []resourceapi.DeviceRequestAllocationResult {
	if claim.Status.Allocation == nil {
		return nil
	}
	var out []resourceapi.DeviceRequestAllocationResult
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == driver {
			out = append(out, r)
		}
	}
	return out
}

// fingerprint identifies what was allocated to the claim by our driver
// and how it is configured.
func fingerprint(claim *resourceapi.ResourceClaim, driver string) string {
	type fp struct {
		Results []resourceapi.DeviceRequestAllocationResult `json:"results"`
		Config  []resourceapi.DeviceAllocationConfiguration `json:"config"`
	}
	f := fp{Results: ourResults(claim, driver)}
	if claim.Status.Allocation != nil {
		for _, c := range claim.Status.Allocation.Devices.Config {
			if c.Opaque != nil && c.Opaque.Driver == driver {
				f.Config = append(f.Config, c)
			}
		}
	}
	data, _ := json.Marshal(f)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:16])
}

// ConfigFor returns the effective configuration of one allocation result:
// DeviceClass configuration first, then claim configuration for all
// requests, then claim configuration naming the request, later ones
// overriding the fields earlier ones set. Errors name the configuration,
// the field and the allowed values.
func ConfigFor(claim *resourceapi.ResourceClaim, driver string, result resourceapi.DeviceRequestAllocationResult) (*v1alpha1.GpuConfig, error) {
	var class, claimAll, claimRequest []*v1alpha1.GpuConfig
	if claim.Status.Allocation != nil {
		for _, c := range resourceclaim.ConfigForResult(claim.Status.Allocation.Devices.Config, result) {
			if c.Opaque.Driver != driver {
				continue
			}
			where := "claim configuration"
			if c.Source == resourceapi.AllocationConfigSourceClass {
				where = "DeviceClass configuration"
			}
			if len(c.Requests) > 0 {
				where += " for requests " + strings.Join(c.Requests, ", ")
			}
			cfg, err := v1alpha1.DecodeGpuConfig(c.Opaque.Parameters.Raw)
			if err == nil {
				err = cfg.Validate()
			}
			if err == nil && c.Source != resourceapi.AllocationConfigSourceClass && cfg.MinEnforcement != "" {
				// The floor is the administrator's: a claim that could
				// set it could also lower it.
				err = field.Forbidden(field.NewPath("minEnforcement"), "only a DeviceClass's configuration may set the enforcement floor; remove it from the claim (use enforcement to choose a mode)")
			}
			if err == nil && c.Source != resourceapi.AllocationConfigSourceClass && cfg.ComputeDefault != "" {
				// Like the floor: a claim that could choose uncapped
				// would escape the cap its class sets for shares without
				// cores.
				err = field.Forbidden(field.NewPath("computeDefault"), "only a DeviceClass's configuration may set the compute default; remove it from the claim (request capacity.requests.cores to choose a compute limit)")
			}
			if err != nil {
				return nil, withReason(ReasonConfig, fmt.Errorf("%s (%s %s): %w", where, v1alpha1.GroupVersion, v1alpha1.GpuConfigKind, err))
			}
			switch {
			case c.Source == resourceapi.AllocationConfigSourceClass:
				class = append(class, cfg)
			case len(c.Requests) == 0:
				claimAll = append(claimAll, cfg)
			default:
				claimRequest = append(claimRequest, cfg)
			}
		}
	}
	merged := &v1alpha1.GpuConfig{}
	for _, group := range [][]*v1alpha1.GpuConfig{class, claimAll, claimRequest} {
		for _, c := range group {
			merged = merged.Merge(c)
		}
	}
	merged.Normalize()
	if err := merged.Validate(); err != nil {
		return merged, withReason(ReasonConfig, err)
	}
	return merged, nil
}

// shareKey names this allocation of a claim (its devices and share IDs),
// so that the interposer's accounting file is new for every allocation.
func shareKey(results []resourceapi.DeviceRequestAllocationResult) string {
	h := sha256.New()
	for _, r := range results {
		share := ""
		if r.ShareID != nil {
			share = string(*r.ShareID)
		}
		fmt.Fprintf(h, "%s/%s/%s;", r.Pool, r.Device, share)
	}
	return hex.EncodeToString(h.Sum(nil)[:6])
}

// newPlan resolves a claim against the node without changing anything.
func (p *Preparer) newPlan(claim *resourceapi.ResourceClaim, results []resourceapi.DeviceRequestAllocationResult, fp string) (*plan, error) {
	inv, devices := p.model()
	if inv == nil {
		return nil, fmt.Errorf("no GPU inventory yet")
	}
	uid := string(claim.UID)
	pl := &plan{claim: claim, record: &checkpoint.Claim{
		UID: uid, Namespace: claim.Namespace, Name: claim.Name, State: checkpoint.PrepareStarted,
		Fingerprint: fp, SpecName: cdispec.SpecName(uid), Pods: consumerPods(claim, nil),
		PreparedBy: checkpoint.Build,
	}}
	for _, r := range results {
		d, err := p.resolve(claim, inv, devices, r)
		if err != nil {
			return nil, fmt.Errorf("request %s, device %s: %w", r.Request, r.Device, err)
		}
		cores, err := enforce.ComputeCap(d.alloc)
		if err != nil {
			return nil, fmt.Errorf("request %s, device %s: %w", r.Request, r.Device, err)
		}
		pl.devices = append(pl.devices, d)
		share := ""
		if r.ShareID != nil {
			share = string(*r.ShareID)
		}
		pl.record.Devices = append(pl.record.Devices, checkpoint.Device{
			Request: r.Request, Pool: r.Pool, Device: r.Device, ShareID: share,
			CDIDeviceID:       cdispec.QualifiedName(cdispec.DeviceName(uid, r.Device, share)),
			Type:              d.name.Type,
			GPUUUID:           d.gpu.UUID,
			UUID:              d.alloc.UUID,
			Memory:            d.alloc.Memory,
			Cores:             cores, // the compute limit: requested or the class's computeDefault
			TimeSliceInterval: string(d.interval),
		})
	}
	// Validate the enforcement plan now, before anything changes; MIG
	// UUIDs are not known yet and do not matter for validation.
	if _, err := enforce.Plan(p.enforceClaim(pl), p.allocations(pl), p.opts.Enforce, p.accountingDir(uid)); err != nil {
		return nil, withReason(ReasonEnforcement, err)
	}
	return pl, nil
}

func (p *Preparer) resolve(claim *resourceapi.ResourceClaim, inv *inventory.Inventory, devices map[string]resourceapi.Device, r resourceapi.DeviceRequestAllocationResult) (planned, error) {
	d := planned{result: r}
	if r.Pool != p.opts.NodeName {
		return d, fmt.Errorf("pool %q is not this node's pool %q", r.Pool, p.opts.NodeName)
	}
	name, err := devicemodel.ParseName(r.Device)
	if err != nil {
		return d, err
	}
	d.name = name
	published, ok := devices[r.Device]
	if !ok {
		return d, fmt.Errorf("this node does not publish device %s (any more): its GPUs or configuration changed since the claim was allocated", r.Device)
	}
	if name.Index < 0 || name.Index >= len(inv.GPUs) || inv.GPUs[name.Index].Index != name.Index {
		return d, fmt.Errorf("GPU %d is not on this node", name.Index)
	}
	d.gpu = inv.GPUs[name.Index]
	cfg, err := ConfigFor(claim, p.opts.DriverName, r)
	if err != nil {
		return d, err
	}
	capMem := published.Capacity[devicemodel.CapMemory].Value
	a := enforce.Allocation{
		Request: r.Request, Device: r.Device, Type: name.Type,
		UUID: d.gpu.UUID, GPUUUID: d.gpu.UUID,
		Memory: uint64(capMem.Value()), ReportedTotal: d.gpu.MemoryBytes, Config: cfg,
	}
	admin := r.AdminAccess != nil && *r.AdminAccess
	switch name.Type {
	case devicemodel.TypeGPU:
		usable := a.Memory
		a.Usable = usable
		if q, ok := r.ConsumedCapacity[devicemodel.CapMemory]; ok {
			if q.Sign() <= 0 || uint64(q.Value()) > usable {
				return d, fmt.Errorf("consumed memory %s is outside 1..%d bytes of the device", q.String(), usable)
			}
			a.Memory = uint64(q.Value())
		}
		if q, ok := r.ConsumedCapacity[devicemodel.CapCores]; ok {
			if q.Sign() < 0 || q.Value() > 100 {
				return d, fmt.Errorf("consumed cores %s is outside 0..100", q.String())
			}
			a.Cores = int(q.Value())
		}
		a.Whole = a.Memory >= usable
		d.interval = cfg.TimeSliceInterval
	case devicemodel.TypeTimeSlice:
		d.interval = cfg.TimeSliceInterval
	case devicemodel.TypeMIG:
		if admin && p.opts.MIGMode == devicemodel.MIGDynamic {
			return d, withReason(ReasonMIG, fmt.Errorf("admin access to dynamically created MIG devices is not supported"))
		}
		var prof *inventory.MIGProfile
		for i := range d.gpu.MIGProfiles {
			if devicemodel.ProfileToken(d.gpu.MIGProfiles[i].Name) == name.ProfileToken {
				prof = &d.gpu.MIGProfiles[i]
			}
		}
		if prof == nil {
			return d, withReason(ReasonMIG, fmt.Errorf("GPU %d has no MIG profile %s", name.Index, name.ProfileToken))
		}
		t, err := mig.Template(d.gpu, *prof, name.Start)
		if err != nil {
			return d, withReason(ReasonMIG, err)
		}
		t.Created = p.opts.MIGMode == devicemodel.MIGDynamic
		d.mig = &t
		a.Memory, a.ReportedTotal = prof.MemoryBytes, prof.MemoryBytes
		a.UUID = "MIG-pending"
		if p.opts.MIGMode != devicemodel.MIGDynamic {
			for _, inst := range d.gpu.MIGInstances {
				if inst.GIProfileID == prof.GIProfileID && inst.Placement.Start == name.Start {
					a.UUID = inst.UUID
				}
			}
		}
	}
	d.alloc = a
	return d, nil
}

func (p *Preparer) enforceClaim(pl *plan) enforce.Claim {
	results := make([]resourceapi.DeviceRequestAllocationResult, 0, len(pl.devices))
	for _, d := range pl.devices {
		results = append(results, d.result)
	}
	c := enforce.Claim{Namespace: pl.claim.Namespace, Name: pl.claim.Name, UID: string(pl.claim.UID), ShareKey: shareKey(results), PreloadFile: p.preloadFile(string(pl.claim.UID))}
	if p.opts.MPS != nil {
		c.MPSPipeDir = p.opts.MPS.PipeDir(c.UID)
	}
	return c
}

func (p *Preparer) allocations(pl *plan) []enforce.Allocation {
	out := make([]enforce.Allocation, 0, len(pl.devices))
	for _, d := range pl.devices {
		out = append(out, d.alloc)
	}
	return out
}

func (p *Preparer) accountingDir(uid string) string {
	return p.accounting().Path(uid)
}

func (p *Preparer) accounting() interposercache.Dirs {
	return interposercache.Dirs{Root: p.opts.AccountingDir, Size: p.opts.AccountingSize, Unbounded: p.opts.AccountingUnbounded}
}

// consumerPods adds the pods a claim is reserved for to known.
func consumerPods(claim *resourceapi.ResourceClaim, known []checkpoint.Pod) []checkpoint.Pod {
	out := append([]checkpoint.Pod(nil), known...)
	for _, r := range claim.Status.ReservedFor {
		if r.Resource != "pods" || r.APIGroup != "" {
			continue
		}
		if !slices.ContainsFunc(out, func(p checkpoint.Pod) bool { return p.UID == string(r.UID) }) {
			out = append(out, checkpoint.Pod{UID: string(r.UID), Name: r.Name})
		}
	}
	return out
}
