// Package decide decides which queued workloads start. One decision
// cycle takes a snapshot of the API (queues, labelled pods, claims,
// templates, slices, classes, nodes) and returns what to do: workloads to
// admit (remove the scheduling gate of every member), why the others wait,
// which over-quota workloads to evict for a queue below its quota, and the
// status of every queue.
//
// Order: queues by fair share (priority first, then the lower dominant
// share), hierarchically; within a queue by pod priority, then FIFO. Work
// that stays within quota on every queue up the hierarchy goes first
// (pass 1); over-quota work gets idle capacity afterwards (pass 2), unless
// a workload within quota waits for capacity that reclaim frees. A workload
// is admitted when every queue up the hierarchy stays within its limit and
// an in-process simulation with the scheduler's allocator places the claims
// of every member (all or nothing) over the live ResourceSlices and the
// current allocations.
//
// Accounting: claims the scheduler allocated are charged from their
// allocation (consumed capacity, the device's memory); admitted claims not
// yet allocated are charged what the simulation placed (kept between cycles
// as reservations so that the next cycle does not hand the same devices out
// again, and rebuilt by simulation after a restart); claims of pods that
// ended are not charged. A claim shared by several pods is charged once.
package decide

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/catalog"
	"github.com/tessera-dev/tessera/pkg/control/podclaims"
	"github.com/tessera-dev/tessera/pkg/control/queue"
)

// Reasons of verdicts, used as event and condition reasons.
const (
	ReasonAdmitted        = "Admitted"
	ReasonInvalid         = "InvalidWorkload"
	ReasonGangIncomplete  = "GangIncomplete"
	ReasonWaitingClaims   = "WaitingForClaims"
	ReasonQueueLimit      = "QueueLimit"
	ReasonDoesNotFit      = "DoesNotFit"
	ReasonOverQuotaHeld   = "OverQuotaHeld"
	ReasonReclaiming      = "Reclaiming"
	ReasonReclaimed       = "Reclaimed"
	ReasonNoDeviceMatches = "NoDeviceMatches"
)

// Config tunes the decisions.
type Config struct {
	// Reclaim evicts over-quota workloads of other queues for a workload
	// within quota that does not fit otherwise.
	Reclaim bool
	// MaxReclaimsPerCycle bounds the workloads one cycle tries to reclaim
	// for (each try simulates the workload against the cluster without
	// candidate victims); the others wait for a later cycle. 0 means the
	// default, 16.
	MaxReclaimsPerCycle int
	// Features are the allocator features of the cluster's scheduler.
	Features structured.Features
	// ExactPlacement gives the allocator every device of a node and tries
	// every claim on every node, without the shortcuts that make placement
	// with selective devices (MIG, prioritized lists) fast: selector
	// results cached per device content, the allocator given only the
	// devices a claim can select plus the allocated ones, and failures
	// shared between claims where one implies the other. The decisions
	// are the same either way (tests compare them); it is there for those
	// tests and for debugging.
	ExactPlacement bool
	// TaintRules lists the DeviceTaintRules for cycles whose snapshot has
	// none (Snapshot.TaintRules nil); nil lists none.
	TaintRules TaintRuleLister
	// ReclaimGracePeriod bounds the grace period of a reclaimed pod: its
	// eviction asks for the pod's own terminationGracePeriodSeconds or
	// this, whichever is shorter, and a victim already terminating with a
	// later deadline is evicted again to cut it. 0 means the default,
	// DefaultReclaimGracePeriod.
	ReclaimGracePeriod time.Duration
	// ReclaimPastBudgets lets reclaim delete over-quota victims whose
	// eviction a PodDisruptionBudget refused, when no other over-quota
	// workloads make room (Eviction.Force). Off: budgets are honoured and
	// the reclaim waits, without holding idle capacity.
	ReclaimPastBudgets bool
}

// DefaultReclaimGracePeriod is Config.ReclaimGracePeriod's default.
const DefaultReclaimGracePeriod = 30 * time.Second

// DefaultConfig is what the controller runs with unless told otherwise.
func DefaultConfig() Config {
	return Config{Reclaim: true, MaxReclaimsPerCycle: 16, Features: allocation.SchedulerFeatures,
		ReclaimGracePeriod: DefaultReclaimGracePeriod, ReclaimPastBudgets: true}
}

// reclaimGrace is the bound on a reclaimed pod's grace period.
func (c Config) reclaimGrace() time.Duration {
	if c.ReclaimGracePeriod <= 0 {
		return DefaultReclaimGracePeriod
	}
	return c.ReclaimGracePeriod
}

// Snapshot is the state of the API one cycle decides on. Objects are read,
// never modified.
type Snapshot struct {
	Queues    []*v1alpha1.Queue
	Pods      []*corev1.Pod
	Claims    []*resourceapi.ResourceClaim
	Templates []*resourceapi.ResourceClaimTemplate
	Slices    []*resourceapi.ResourceSlice
	Classes   []*resourceapi.DeviceClass
	Nodes     []*corev1.Node
	// Namespaces are the cluster's namespaces: a queue's namespaceSelector
	// is matched against their labels when a pod is admitted (rules.go),
	// and the claims that unqueued pods of a namespace labelled with a
	// queue (a managed namespace) hold are charged to it (charges.go).
	Namespaces []*corev1.Namespace
	// TaintRules are the DeviceTaintRules, applied to the slices as the
	// scheduler applies them (taintrules.go); nil: Config.TaintRules.
	TaintRules []*resourceapi.DeviceTaintRule
	// Refused are the pods whose eviction for reclaim the API refused
	// lately, by UID (the controller remembers them for a while): reclaim
	// passes them over for other victims (reclaim.go).
	Refused map[types.UID]Refusal
	// Now is the time of the snapshot; zero means time.Now().
	Now time.Time
}

// Refusal is an eviction the API refused.
type Refusal struct {
	// At is when it was refused.
	At time.Time
	// Budget says that a PodDisruptionBudget refused it (HTTP 429);
	// otherwise something else did (an admission webhook or policy, RBAC,
	// an error), and nothing gets past it.
	Budget bool
}

// Admission is a workload to start: remove the gate from every pod.
type Admission struct {
	Workload *Workload
	Pods     []*corev1.Pod
	// Nodes is where the simulation placed each pod's claims.
	Nodes   map[types.UID]string
	Charge  queue.Vector
	Message string
	// Holds is what each pod's claims were charged at admission, every
	// claim counted whole (v1alpha1.AdmittedChargeAnnotation).
	Holds map[types.UID]queue.Vector
}

// Verdict says why a workload waits.
type Verdict struct {
	Workload *Workload
	Reason   string
	Message  string
	// Invalid marks bad input: the workload is not admitted as it is.
	Invalid bool
	// Fault classifies bad input (one of Faults) when Invalid.
	Fault string
}

// Eviction is an admitted workload to evict (all its pods).
type Eviction struct {
	Workload *Workload
	Pods     []*corev1.Pod
	// Reason is ReasonReclaimed, or ReasonOverLimit (charges.go).
	Reason  string
	Message string
	// For is the workload a reclaim evicts it for; nil otherwise.
	For *Workload
	// GracePeriod bounds each pod's grace period (GraceSeconds); 0: the
	// pod's own.
	GracePeriod time.Duration
	// Force: a PodDisruptionBudget refused this workload's eviction
	// before and no other over-quota workloads make room; when the
	// Eviction API refuses again, the pods are deleted (with the same
	// grace period).
	Force bool
}

// GraceSeconds is the grace period to evict p with under a bound: the
// pod's own terminationGracePeriodSeconds (the API's default, 30 s, when
// unset) or the bound, whichever is shorter, and at least 1 s (0 would
// remove the pod from the API before its containers stop). nil when there
// is no bound.
func GraceSeconds(p *corev1.Pod, bound time.Duration) *int64 {
	if bound <= 0 {
		return nil
	}
	own := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if p.Spec.TerminationGracePeriodSeconds != nil {
		own = *p.Spec.TerminationGracePeriodSeconds
	}
	s := min(own, int64(bound/time.Second))
	return ptr.To(max(s, 1))
}

// Stats describe a cycle.
type Stats struct {
	Workloads, Pending, Admitted, Waiting, Invalid, Evicted int
	AllocatorCalls                                          int
	// SharedFailures counts allocator runs skipped because another claim's
	// failure on the node implies the claim's (see ExactPlacement).
	SharedFailures int
	// CELEvaluations counts the selector evaluations of the shortcuts that
	// no earlier result for the same expression and the same device parts
	// spared; StrippedCalls the allocator calls without selectors.
	CELEvaluations, StrippedCalls int
	Duration                      time.Duration
}

// Decision is the outcome of one cycle.
type Decision struct {
	Admit   []*Admission
	Waiting []*Verdict
	Evict   []*Eviction
	// Queues is the status of every queue, by name.
	Queues map[string]*v1alpha1.QueueStatus
	Stats  Stats
}

// reservation is the simulated allocation of an admitted claim the
// scheduler has not allocated yet.
type reservation struct {
	node   string
	result resourceapi.AllocationResult
	charge queue.Vector
}

// Engine decides admission cycle after cycle. It remembers only the
// reservations of admitted claims not yet allocated; everything else comes
// from the snapshot, so a new Engine (a restarted controller) rebuilds the
// same accounting from the API.
type Engine struct {
	cfg          Config
	mu           sync.Mutex
	cel          *cel.Cache
	reservations map[string]*reservation
	// What the last cycle derived from the slices and classes, kept while
	// they are the same objects: the catalog, the device indexes per node
	// and CEL results (placeCache).
	slices  []*resourceapi.ResourceSlice
	classes []*resourceapi.DeviceClass
	catalog *catalog.Catalog
	places  *placeCache
	// taints are the slices patched with DeviceTaintRules.
	taints *taintMemo
}

// NewEngine returns an engine.
func NewEngine(cfg Config) *Engine {
	return &Engine{cfg: cfg, cel: cel.NewCache(1000, cel.Features{}), reservations: map[string]*reservation{}}
}

// Forget drops what the engine remembers about the admission of these pods'
// claims, e.g. when ungating them failed.
func (e *Engine) Forget(pods ...*corev1.Pod) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range pods {
		prefix := "pod:" + string(p.UID) + "/"
		for k := range e.reservations {
			if strings.HasPrefix(k, prefix) {
				delete(e.reservations, k)
			}
		}
	}
}

type objects struct {
	claims    map[string]*resourceapi.ResourceClaim
	templates map[string]*resourceapi.ResourceClaimTemplate
	ext       *podclaims.ExtendedResources
}

func (o *objects) ExtendedResources() *podclaims.ExtendedResources { return o.ext }

func (o *objects) Claim(ns, name string) *resourceapi.ResourceClaim { return o.claims[ns+"/"+name] }
func (o *objects) Template(ns, name string) *resourceapi.ResourceClaimTemplate {
	return o.templates[ns+"/"+name]
}

// cycle is the working state of one decision.
type cycle struct {
	e        *Engine
	ctx      context.Context
	logger   klog.Logger
	snap     *Snapshot
	tree     *queue.Tree
	cat      *catalog.Catalog
	placer   *placer
	objs     *objects
	charged  map[string]bool
	estCache map[string]estimate
	// specEst holds the estimates without error per claim spec (as JSON):
	// the claims of one template are estimated once.
	specEst  map[string]estimate
	seen     map[string]bool // reservations still in use
	admitted []*Workload
	counts   map[*queue.Queue]*[2]int32 // admitted, pending
	// used is what admitted workloads' claims use (their plugins'
	// samples), per queue with its descendants; sampled marks queues with
	// at least one sampled claim.
	used    map[*queue.Queue]uint64
	sampled map[*queue.Queue]bool
	dec     *Decision
	// held is set once a workload within quota waits for capacity that
	// reclaim frees: over-quota work is then not admitted this cycle.
	held *Workload
	// reclaims counts reclaim tries this cycle.
	reclaims int
	// namespaces are the labels of the snapshot's namespaces, by name.
	namespaces map[string]map[string]string
	// now is the snapshot's time.
	now time.Time
}

type estimate struct {
	v   queue.Vector
	err error
}

// Decide runs one admission cycle.
func (e *Engine) Decide(ctx context.Context, snap *Snapshot) (*Decision, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	start := time.Now()
	rules := snap.TaintRules
	if rules == nil && e.cfg.TaintRules != nil {
		var err error
		if rules, err = e.cfg.TaintRules(ctx); err != nil {
			return nil, fmt.Errorf("listing DeviceTaintRules: %w", err)
		}
	}
	if patched := e.withTaintRules(snap.Slices, rules); len(rules) > 0 {
		s := *snap
		s.Slices = patched
		snap = &s
	}
	e.keepCatalog(snap)
	if e.places == nil || e.places.full() {
		e.places = newPlaceCache()
	}
	c := e.newCycle(ctx, snap, e.catalog, newPlacer(snap.Nodes, snap.Slices, snap.Classes, e.cfg.Features, e.cel, e.cfg.ExactPlacement, e.places))
	// Everything the scheduler allocated, whoever it belongs to.
	for _, cl := range snap.Claims {
		if a := cl.Status.Allocation; a != nil {
			if sn := c.placer.nodeOf(a); sn != nil {
				c.placer.add(sn, a)
			}
		}
	}
	workloads := append(groupWorkloads(snap.Pods, c.tree), c.adopt()...)
	c.dec.Stats.Workloads = len(workloads)
	var pending []*Workload
	for _, w := range workloads {
		if w.Admitted {
			c.admitted = append(c.admitted, w)
		} else {
			pending = append(pending, w)
		}
	}
	if err := c.chargeAdmitted(); err != nil {
		return nil, err
	}
	c.checkHoldings()
	c.claimConflicts(pending, c.admitted)
	c.checkNamespaces(pending)
	for k := range e.reservations {
		if !c.seen[k] {
			delete(e.reservations, k)
		}
	}
	if err := c.decidePending(pending); err != nil {
		return nil, err
	}
	c.recordHolds()
	c.queueStatus()
	c.dec.Stats.Pending = len(pending)
	c.dec.Stats.Admitted = len(c.dec.Admit)
	c.dec.Stats.Evicted = len(c.dec.Evict)
	for _, v := range c.dec.Waiting {
		if v.Invalid {
			c.dec.Stats.Invalid++
		} else {
			c.dec.Stats.Waiting++
		}
	}
	c.dec.Stats.AllocatorCalls = c.placer.calls
	c.dec.Stats.SharedFailures = c.placer.sharedFailures
	c.dec.Stats.CELEvaluations, c.dec.Stats.StrippedCalls = c.placer.celEvaluations, c.placer.strippedCalls
	c.dec.Stats.Duration = time.Since(start)
	return c.dec, nil
}

// keepCatalog rebuilds the catalog when snap's slices or classes are not
// the objects it was built from (and drops the placement cache with the
// classes), and remembers them. Called with e.mu held.
func (e *Engine) keepCatalog(snap *Snapshot) {
	if !sameObjects(snap.Classes, e.classes) {
		e.catalog, e.places = nil, nil
	} else if !sameObjects(snap.Slices, e.slices) {
		e.catalog = nil
	}
	if e.catalog == nil {
		e.catalog = catalog.NewCatalog(snap.Slices, snap.Classes, e.cel)
	}
	e.slices, e.classes = snap.Slices, snap.Classes
}

// newCycle returns the working state of one cycle on snap; pl is nil for
// a status refresh (Status), which places nothing.
func (e *Engine) newCycle(ctx context.Context, snap *Snapshot, cat *catalog.Catalog, pl *placer) *cycle {
	c := &cycle{
		e: e, ctx: ctx, logger: klog.FromContext(ctx), snap: snap,
		tree:   queue.NewTree(snap.Queues),
		cat:    cat,
		placer: pl,
		objs: &objects{claims: map[string]*resourceapi.ResourceClaim{}, templates: map[string]*resourceapi.ResourceClaimTemplate{},
			ext: podclaims.NewExtendedResources(snap.Classes)},
		charged:  map[string]bool{},
		estCache: map[string]estimate{},
		specEst:  map[string]estimate{},
		seen:     map[string]bool{},
		counts:   map[*queue.Queue]*[2]int32{},
		used:     map[*queue.Queue]uint64{},
		sampled:  map[*queue.Queue]bool{},
		dec:      &Decision{Queues: map[string]*v1alpha1.QueueStatus{}},
		now:      snap.Now,
	}
	if c.now.IsZero() {
		c.now = time.Now()
	}
	for _, cl := range snap.Claims {
		c.objs.claims[cl.Namespace+"/"+cl.Name] = cl
	}
	for _, t := range snap.Templates {
		c.objs.templates[t.Namespace+"/"+t.Name] = t
	}
	c.namespaces = make(map[string]map[string]string, len(snap.Namespaces))
	for _, ns := range snap.Namespaces {
		c.namespaces[ns.Name] = ns.Labels
	}
	return c
}

func (c *cycle) count(q *queue.Queue, i int) {
	for n := q; n != nil; n = n.Parent {
		if c.counts[n] == nil {
			c.counts[n] = &[2]int32{}
		}
		c.counts[n][i]++
	}
}

// chargeAdmitted charges admitted workloads, earliest admission first (a
// shared claim goes to the first), and re-places admitted claims that are
// neither allocated nor reserved (after a restart).
func (c *cycle) chargeAdmitted() error {
	sort.SliceStable(c.admitted, func(i, j int) bool {
		a, b := c.admitted[i], c.admitted[j]
		if !a.AdmittedAt.Equal(b.AdmittedAt) {
			return a.AdmittedAt.Before(b.AdmittedAt)
		}
		return a.Key < b.Key
	})
	type replace struct {
		w     *Workload
		pod   *corev1.Pod
		infos []claimInfo
	}
	var toPlace []replace
	for _, w := range c.admitted {
		w.claims = map[*corev1.Pod][]podclaims.PodClaim{}
		for _, p := range w.Pods {
			pcs, err := podclaims.PodClaims(p, c.objs)
			if err != nil {
				c.logger.V(4).Info("Admitted pod has claims that do not exist", "pod", klog.KObj(p), "err", err)
				continue
			}
			w.claims[p] = pcs
		}
	}
	drifted := c.driftedNodes()
	for _, w := range c.admitted {
		for _, p := range w.Pods {
			pcs, ok := w.claims[p]
			if !ok {
				continue
			}
			var infos []claimInfo
			needs := false
			for _, pc := range pcs {
				if c.charged[pc.Key] {
					infos = append(infos, claimInfo{pc: pc, settled: true})
					continue
				}
				c.charged[pc.Key] = true
				switch r := c.e.reservations[pc.Key]; {
				case pc.Allocated():
					w.Charge = w.Charge.Add(c.cat.ChargeAllocation(pc.Claim.Status.Allocation))
					if used, ok := c.cat.MemoryUsed(pc.Claim); ok {
						for n := w.leaf; n != nil; n = n.Parent {
							c.used[n] += used
							c.sampled[n] = true
						}
					}
					var sn *placeNode
					if c.placer != nil {
						sn = c.placer.nodeOf(pc.Claim.Status.Allocation)
					}
					if sn != nil {
						w.holdings = append(w.holdings, holding{sn, pc.Claim.Status.Allocation})
					}
					infos = append(infos, claimInfo{pc: pc, node: sn, settled: true})
				case r != nil && c.placer == nil:
					// A status refresh: charged what was reserved.
					w.Charge = w.Charge.Add(r.charge)
					infos = append(infos, claimInfo{pc: pc, settled: true})
				case r != nil && c.placer.byName[r.node] != nil && !drifted[r.node]:
					sn := c.placer.byName[r.node]
					c.placer.add(sn, &r.result)
					c.seen[pc.Key] = true
					w.Charge = w.Charge.Add(r.charge)
					w.holdings = append(w.holdings, holding{sn, &r.result})
					infos = append(infos, claimInfo{pc: pc, node: sn, settled: true})
				default:
					needs = true
					infos = append(infos, claimInfo{pc: pc})
				}
			}
			if needs {
				toPlace = append(toPlace, replace{w, p, infos})
			}
		}
	}
	for _, r := range toPlace {
		if c.placer == nil {
			// A status refresh places nothing: charged the estimate, as
			// when it does not fit.
			c.chargeEstimates(r.w, r.infos)
			continue
		}
		t := c.placer.newTrial()
		if n := r.pod.Annotations[v1alpha1.NodeAnnotation]; n != "" {
			t.hint = c.placer.byName[n]
		}
		ok, err := t.placePod(c.ctx, r.pod, r.infos)
		if err != nil {
			if ctxErr := c.ctx.Err(); ctxErr != nil {
				return ctxErr
			}
			// The allocator refuses its claims now (a class changed): it
			// is charged its estimate, as when it does not fit, and the
			// cycle goes on.
			c.logger.V(2).Info("Admitted pod's claims cannot be placed again", "pod", klog.KObj(r.pod), "err", err)
			t.rollback()
			ok = false
		}
		if ok {
			c.reserve(r.w, t)
			continue
		}
		// It does not fit any more (someone else took the devices): charge
		// the estimate; the scheduler will tell.
		c.chargeEstimates(r.w, r.infos)
	}
	for _, w := range c.admitted {
		if w.leaf != nil && w.leaf.Invalid == "" {
			queue.Charge(w.leaf, w.Charge)
			c.count(w.leaf, 0)
		}
	}
	return nil
}

// driftedNodes are the nodes where the scheduler allocated an admitted
// claim on other devices than its reservation named. It picks the first
// free device in its own view, and the gates of a cycle come off in
// parallel, so the pod admitted last may get the device reserved for the
// first: the reservations left on that node may name devices that are
// taken now, and counting a device once for two claims would show a full
// node with room. Their claims are placed again on their node instead
// (chargeAdmitted), after every allocation is counted. It reads the claims
// chargeAdmitted resolved (w.claims).
func (c *cycle) driftedNodes() map[string]bool {
	drifted := map[string]bool{}
	if c.placer == nil {
		return drifted
	}
	for _, w := range c.admitted {
		for _, pcs := range w.claims {
			for _, pc := range pcs {
				if r := c.e.reservations[pc.Key]; r != nil && pc.Allocated() && !sameDevices(&r.result, pc.Claim.Status.Allocation) {
					drifted[r.node] = true
				}
			}
		}
	}
	return drifted
}

// sameDevices says whether two allocations name the same devices (shares
// of a device count as the device).
func sameDevices(a, b *resourceapi.AllocationResult) bool {
	ids := func(r *resourceapi.AllocationResult) map[structured.DeviceID]int {
		m := map[structured.DeviceID]int{}
		for _, d := range r.Devices.Results {
			m[structured.MakeDeviceID(d.Driver, d.Pool, d.Device)]++
		}
		return m
	}
	return maps.Equal(ids(a), ids(b))
}

// chargeEstimates charges w the estimate of every claim of infos not
// settled.
func (c *cycle) chargeEstimates(w *Workload, infos []claimInfo) {
	for _, ci := range infos {
		if !ci.settled {
			w.Charge = w.Charge.Add(c.estimate(ci.pc).v)
		}
	}
}

// reserve records the placements of a trial as reservations of w and
// charges their real cost to w.Charge.
func (c *cycle) reserve(w *Workload, t *trial) {
	for _, p := range t.done {
		for i, k := range p.keys {
			res := p.results[i]
			ch := c.cat.ChargeAllocation(&res)
			c.e.reservations[k] = &reservation{node: p.node.node.Name, result: res, charge: ch}
			c.seen[k] = true
			c.charged[k] = true
			w.Charge = w.Charge.Add(ch)
			w.holdings = append(w.holdings, holding{p.node, &c.e.reservations[k].result})
		}
	}
}

func (c *cycle) estimate(pc podclaims.PodClaim) estimate {
	if e, ok := c.estCache[pc.Key]; ok {
		return e
	}
	// An error names the claim: it is not shared with other claims.
	var spec string
	if c.placer != nil {
		spec = c.placer.specJSON(pc.Claim)
	} else {
		data, _ := json.Marshal(pc.Claim.Spec)
		spec = string(data)
	}
	e, ok := c.specEst[spec]
	if !ok {
		v, err := c.cat.EstimateClaim(c.ctx, pc.Display, &pc.Claim.Spec)
		e = estimate{v, err}
		if err == nil {
			c.specEst[spec] = e
		}
	}
	c.estCache[pc.Key] = e
	return e
}

// resolveDemand resolves the claims of a pending workload and estimates its
// demand; problems become verdicts.
func (c *cycle) resolveDemand(w *Workload) (queue.Vector, *Verdict) {
	w.claims = map[*corev1.Pod][]podclaims.PodClaim{}
	var total queue.Vector
	seen := map[string]bool{}
	for _, p := range w.Pods {
		pcs, err := podclaims.PodClaims(p, c.objs)
		if err != nil {
			return total, &Verdict{Workload: w, Reason: ReasonWaitingClaims, Message: fmt.Sprintf("%s: %v", w.Describe(), err)}
		}
		w.claims[p] = pcs
		for _, pc := range pcs {
			if seen[pc.Key] || c.charged[pc.Key] {
				continue
			}
			seen[pc.Key] = true
			if f := checkClaim(pc); f != nil {
				return total, &Verdict{Workload: w, Reason: ReasonInvalid, Invalid: true, Fault: f.fault, Message: fmt.Sprintf("%s: %s", w.Describe(), f.msg)}
			}
			if pc.Allocated() {
				// Allocated, and no admitted workload is charged for it (its
				// users so far were in no queue, or ended): it is charged to
				// this workload once admitted, so it counts against the limit.
				total = total.Add(c.cat.ChargeAllocation(pc.Claim.Status.Allocation))
				continue
			}
			est := c.estimate(pc)
			var bad *catalog.BadInputError
			switch {
			case errors.As(est.err, &bad):
				return total, &Verdict{Workload: w, Reason: ReasonInvalid, Invalid: true, Fault: FaultClaim, Message: fmt.Sprintf("%s: %s", w.Describe(), bad.Msg)}
			case est.err != nil:
				return total, &Verdict{Workload: w, Reason: ReasonNoDeviceMatches, Message: fmt.Sprintf("%s: %v", w.Describe(), est.err)}
			}
			total = total.Add(est.v)
		}
	}
	return total, nil
}

type leafQueue struct {
	q      *queue.Queue
	work   []*Workload
	demand []queue.Vector
	next   int
	pass2  []int // indexes deferred to pass 2
	next2  int
}

func (c *cycle) decidePending(pending []*Workload) error {
	leaves := map[*queue.Queue]*leafQueue{}
	for _, w := range pending {
		switch {
		case w.problem != "":
			c.verdict(&Verdict{Workload: w, Reason: ReasonInvalid, Message: w.problem, Invalid: true, Fault: FaultLabels})
			continue
		case w.wait != "":
			c.countPending(w)
			c.verdict(&Verdict{Workload: w, Reason: w.waitWhy, Message: w.wait})
			continue
		}
		d, v := c.resolveDemand(w)
		if v != nil {
			c.countPending(w)
			c.verdict(v)
			continue
		}
		lq := leaves[w.leaf]
		if lq == nil {
			lq = &leafQueue{q: w.leaf}
			leaves[w.leaf] = lq
		}
		lq.work = append(lq.work, w)
		lq.demand = append(lq.demand, d)
		queue.AddPending(w.leaf, d)
	}
	for _, lq := range leaves {
		idx := make([]int, len(lq.work))
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(a, b int) bool {
			x, y := lq.work[idx[a]], lq.work[idx[b]]
			if x.Priority != y.Priority {
				return x.Priority > y.Priority
			}
			if !x.Created.Equal(y.Created) {
				return x.Created.Before(y.Created)
			}
			return x.Key < y.Key
		})
		work, dem := make([]*Workload, len(idx)), make([]queue.Vector, len(idx))
		for i, j := range idx {
			work[i], dem[i] = lq.work[j], lq.demand[j]
		}
		lq.work, lq.demand = work, dem
	}
	c.tree.ComputeFairShare(c.cat.Capacity())

	// Pass 1: within quota on every queue up the hierarchy. Pass 2: the
	// rest, on idle capacity.
	for pass := 1; pass <= 2; pass++ {
		active := map[*queue.Queue]int{}
		for q, lq := range leaves {
			n := len(lq.work)
			if pass == 2 {
				n = len(lq.pass2)
			}
			if n > 0 {
				for a := q; a != nil; a = a.Parent {
					active[a]++
				}
			}
		}
		for {
			leaf := pickLeaf(c.tree.Roots, active)
			if leaf == nil {
				break
			}
			lq := leaves[leaf]
			var i int
			if pass == 1 {
				i = lq.next
				lq.next++
			} else {
				i = lq.pass2[lq.next2]
				lq.next2++
			}
			if (pass == 1 && lq.next == len(lq.work)) || (pass == 2 && lq.next2 == len(lq.pass2)) {
				for a := leaf; a != nil; a = a.Parent {
					active[a]--
				}
			}
			deferred, err := c.decideIsolated(lq.work[i], lq.demand[i], pass)
			if err != nil {
				return err
			}
			if deferred {
				lq.pass2 = append(lq.pass2, i)
			}
		}
	}
	return nil
}

// pickLeaf descends from the roots, taking at each level the child first
// in fair-share order among those with work left.
func pickLeaf(siblings []*queue.Queue, active map[*queue.Queue]int) *queue.Queue {
	var best *queue.Queue
	for _, q := range siblings {
		if active[q] <= 0 || q.Invalid != "" {
			continue
		}
		if best == nil || queue.Before(q, best) {
			best = q
		}
	}
	if best == nil {
		return nil
	}
	if best.IsLeaf() {
		return best
	}
	if leaf := pickLeaf(best.Children, active); leaf != nil {
		return leaf
	}
	// Work left on a non-leaf queue itself cannot happen (only leaves take
	// workloads); stop rather than loop.
	active[best] = 0
	return pickLeaf(siblings, active)
}

func (c *cycle) verdict(v *Verdict) { c.dec.Waiting = append(c.dec.Waiting, v) }

func (c *cycle) countPending(w *Workload) {
	if w.leaf != nil {
		c.count(w.leaf, 1)
	}
}

// decide handles one pending workload. In pass 1 it returns true to defer
// a workload that would go over quota to pass 2.
func (c *cycle) decide(w *Workload, d queue.Vector, pass int) (bool, error) {
	leaf := w.leaf
	if v := queue.CheckLimits(leaf, d); v != nil {
		c.countPending(w)
		c.verdict(&Verdict{Workload: w, Reason: ReasonQueueLimit, Message: v.Message(leaf)})
		return false, nil
	}
	over := queue.CheckQuota(leaf, d)
	if over != nil && pass == 1 {
		return true, nil
	}
	if over != nil && c.held != nil {
		c.countPending(w)
		c.verdict(&Verdict{Workload: w, Reason: ReasonOverQuotaHeld, Message: fmt.Sprintf("%s; over quota, and idle capacity is held for %s in queue %s", over.Message(leaf), c.held.DescribeTo(w.Namespace), c.held.leaf.Name)})
		return false, nil
	}
	t, fit, err := c.simulate(w)
	if err != nil {
		return false, err // simulate rolled back
	}
	if fit == len(w.Pods) {
		c.admit(w, t)
		return false, nil
	}
	t.rollback()
	c.countPending(w)
	msg := c.fitMessage(w, fit)
	if over != nil {
		c.verdict(&Verdict{Workload: w, Reason: ReasonDoesNotFit, Message: fmt.Sprintf("%s; over quota and no idle capacity fits it (%s)", over.Message(leaf), msg)})
		return false, nil
	}
	budget := c.e.cfg.MaxReclaimsPerCycle
	if budget <= 0 {
		budget = 16
	}
	if c.e.cfg.Reclaim && c.reclaims < budget {
		c.reclaims++
		handled, why, err := c.reclaim(w, msg)
		if err != nil || handled {
			return false, err
		}
		msg += why
	}
	c.verdict(&Verdict{Workload: w, Reason: ReasonDoesNotFit, Message: msg})
	return false, nil
}

func (c *cycle) fitMessage(w *Workload, fit int) string {
	if w.Gang {
		return fmt.Sprintf("gang %s: %d of %d members' claims fit", w.Name, fit, len(w.Pods))
	}
	return fmt.Sprintf("pod %s: its claims fit on no node now", w.Name)
}

// simulate places the claims of every member; it returns the trial (with
// placements applied) and the number of members that fit. Members that
// fail do not stop the count. An error of the allocator stops it, with the
// trial rolled back.
func (c *cycle) simulate(w *Workload) (*trial, int, error) {
	t := c.placer.newTrial()
	fit := 0
	for _, p := range w.Pods {
		infos := make([]claimInfo, 0, len(w.claims[p]))
		for _, pc := range w.claims[p] {
			ci := claimInfo{pc: pc}
			switch r := c.e.reservations[pc.Key]; {
			case pc.Allocated():
				ci.settled = true
				ci.node = c.placer.nodeOf(pc.Claim.Status.Allocation)
			case r != nil && c.charged[pc.Key]:
				ci.settled = true
				ci.node = c.placer.byName[r.node]
			case c.charged[pc.Key]:
				ci.settled = true
			}
			infos = append(infos, ci)
		}
		ok, err := t.placePod(c.ctx, p, infos)
		if err != nil {
			t.rollback()
			return t, 0, err
		}
		if ok {
			fit++
		}
	}
	return t, fit, nil
}

func (c *cycle) admit(w *Workload, t *trial) {
	c.reserve(w, t)
	queue.Charge(w.leaf, w.Charge)
	c.count(w.leaf, 0)
	c.admitted = append(c.admitted, w)
	c.dec.Admit = append(c.dec.Admit, &Admission{
		Workload: w, Pods: w.Pods, Nodes: t.nodeNames(), Charge: w.Charge,
		Message: fmt.Sprintf("%s admitted to queue %s: %s", w.Describe(), w.leaf.Name, w.Charge),
	})
}

func (c *cycle) queueStatus() {
	for name, q := range c.tree.Queues {
		st := &v1alpha1.QueueStatus{
			Allocated: list(q.Allocated),
			Pending:   list(q.Pending),
			FairShare: list(q.FairShare),
		}
		if n := c.counts[q]; n != nil {
			st.AdmittedWorkloads, st.PendingWorkloads = n[0], n[1]
		}
		if c.sampled[q] {
			st.Used = v1alpha1.ResourceList{queue.Names[queue.Memory]: queue.Quantity(queue.Memory, int64(c.used[q]))}
		}
		c.dec.Queues[name] = st
	}
}

func list(v queue.Vector) v1alpha1.ResourceList {
	out := v1alpha1.ResourceList{}
	for r := range queue.NumResources {
		out[queue.Names[r]] = queue.Quantity(queue.Resource(r), v[r])
	}
	return out
}

// QueueProblems returns why queues cannot take workloads, by name.
func QueueProblems(queues []*v1alpha1.Queue) map[string]string {
	out := map[string]string{}
	for name, q := range queue.NewTree(queues).Queues {
		if q.Invalid != "" {
			out[name] = q.Invalid
		}
	}
	return out
}
