package decide

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/catalog"
	"github.com/tessera-dev/tessera/pkg/control/podclaims"
	"github.com/tessera-dev/tessera/pkg/control/queue"
)

// objects are the snapshot's claims and templates by namespace/name, and
// the classes' extended resources: what podclaims resolves a pod's claims
// from.
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

// estimate is a claim's estimated charge, or why there is none.
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
	c, pending, err := e.open(ctx, snap, true)
	if err != nil {
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

// open is the opening a cycle (Decide) and a status refresh (Status)
// share, called with e.mu held: it keeps the catalog for snap, builds the
// cycle's state, groups the pods into workloads and charges the admitted
// ones (chargeAdmitted); it returns the cycle and the pending workloads.
// With place, the cycle gets a placer with everything the scheduler
// allocated, whoever it belongs to; without (a status refresh) it places
// nothing.
func (e *Engine) open(ctx context.Context, snap *Snapshot, place bool) (*cycle, []*Workload, error) {
	e.keepCatalog(snap)
	var pl *placer
	if place {
		if e.places == nil || e.places.full() {
			e.places = newPlaceCache()
		}
		pl = newPlacer(snap.Nodes, snap.Slices, snap.Attributes, snap.Classes, e.cfg.Features, e.cel, e.cfg.ExactPlacement, e.places)
	}
	c := e.newCycle(ctx, snap, pl)
	if pl != nil {
		for _, cl := range snap.Claims {
			if a := cl.Status.Allocation; a != nil {
				if sn := pl.nodeOf(a); sn != nil {
					pl.add(sn, a)
				}
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
		return nil, nil, err
	}
	return c, pending, nil
}

// newCycle returns the working state of one cycle on snap with the
// engine's catalog; pl is nil for a status refresh (Status), which places
// nothing.
func (e *Engine) newCycle(ctx context.Context, snap *Snapshot, pl *placer) *cycle {
	c := &cycle{
		e: e, ctx: ctx, logger: klog.FromContext(ctx), snap: snap,
		tree:   queue.NewTree(snap.Queues),
		cat:    e.catalog,
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

// count counts a workload of q and its ancestors: admitted (i 0) or
// pending (i 1).
func (c *cycle) count(q *queue.Queue, i int) {
	for n := q; n != nil; n = n.Parent {
		if c.counts[n] == nil {
			c.counts[n] = &[2]int32{}
		}
		c.counts[n][i]++
	}
}

// estimate is the charge a claim is estimated at before it is placed,
// cached per claim and, without error, per claim spec.
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

// leafQueue is the pending work of a leaf queue in the order it is
// decided, with each workload's demand.
type leafQueue struct {
	q      *queue.Queue
	work   []*Workload
	demand []queue.Vector
	next   int
	pass2  []int // indexes deferred to pass 2
	next2  int
}

// decidePending decides the pending workloads: invalid and waiting ones
// get their verdict, the others are ordered within their leaf queue and
// decided across queues in fair-share order, within quota first (pass 1),
// then over quota on idle capacity (pass 2).
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

// verdict records why a workload waits.
func (c *cycle) verdict(v *Verdict) { c.dec.Waiting = append(c.dec.Waiting, v) }

// countPending counts w as pending in its queue, if it has one.
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

// fitMessage says why w does not fit: only fit of its members did.
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

// admit admits w with the placements of trial t: reserved, charged to
// its queue and counted.
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
