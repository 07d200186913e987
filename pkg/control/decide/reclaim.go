package decide

import (
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/control/queue"
)

// reclaim handles a workload within quota that does not fit: when the
// over-quota workloads of other queues hold what it needs, it evicts the
// fewest of them (lowest priority, most recently admitted first; gangs
// whole), never taking a queue below its quota. Workloads already being
// deleted count as gone. The workload is admitted in a later cycle, once
// what it needs is free (admitting it onto devices still held would let the
// scheduler hand the rest of them to others first); for the rest of this
// cycle its future place is kept from other work and over-quota work waits.
//
// The victims do not decide how long that takes: every eviction carries
// the reclaim grace period (Config.ReclaimGracePeriod) as a bound, and a
// victim that is already terminating with a later deadline is evicted
// again to cut it. Nor do they decide whether it happens: a victim whose
// eviction the API refused (Snapshot.Refused) is passed over for others
// that make room; one that only a PodDisruptionBudget protects is taken
// when no others do (Eviction.Force, with Config.ReclaimPastBudgets); and
// when nothing can make room the workload waits without holding anything,
// so idle capacity stays open to other queues.
//
// It returns true when it recorded a verdict, else what the workload's
// waiting message should add (refused evictions, if any).
func (c *cycle) reclaim(w *Workload, fitMsg string) (bool, string, error) {
	var terminating, cuttable, candidates, forceable, blocked []*Workload
	for _, a := range c.admitted {
		switch {
		case a.Terminating:
			// Gone soon: reclaim cuts its grace period, or it ends within
			// the reclaim grace period anyway. Otherwise (a queue's own
			// long-grace delete, a pod stuck past its deadline) it holds
			// its devices here as if it ran: waiting for it would hold
			// idle capacity for longer than any eviction takes.
			switch cut := c.reclaimable(a, w); {
			case !c.endsSoon(a, cut):
			case cut:
				terminating = append(terminating, a)
				cuttable = append(cuttable, a)
			default:
				terminating = append(terminating, a)
			}
		case a.adopted:
			// Never admitted by Tessera: charged, not reclaimed.
		case c.reclaimable(a, w):
			switch r, refused := c.refusal(a); {
			case !refused:
				candidates = append(candidates, a)
			case r.Budget && c.e.cfg.ReclaimPastBudgets:
				forceable = append(forceable, a)
			default:
				blocked = append(blocked, a)
			}
		}
	}
	why := c.refusedNote(w, blocked)
	// Claims still allocated to pods that ended (the resourceclaim
	// controller deallocates them in a moment): a victim whose pods
	// stopped is no workload any more, but its devices are not free yet.
	// They count as going, as terminating workloads do; otherwise reclaim
	// would take one more victim in that moment.
	if ending := c.endingAllocations(); len(ending) > 0 {
		terminating = append(terminating, &Workload{Key: endedKey, holdings: ending})
	}
	if len(terminating) == 0 && len(candidates) == 0 && len(forceable) == 0 {
		return false, why, nil
	}
	free := func(a *Workload) {
		for _, h := range a.holdings {
			c.placer.remove(h.node, h.result)
		}
	}
	hold := func(a *Workload) {
		for _, h := range a.holdings {
			c.placer.add(h.node, h.result)
		}
	}
	fits := func() (bool, error) {
		t, fit, err := c.simulate(w)
		t.rollback()
		return err == nil && fit == len(w.Pods), err
	}
	// keep places the workload where the freed devices are, then gives the
	// going workloads their devices back: they hold them until they are
	// gone, and nothing else is planned onto the workload's place.
	keep := func(going []*Workload) error {
		_, _, err := c.simulate(w)
		for _, a := range going {
			hold(a)
		}
		return err
	}
	for _, a := range terminating {
		free(a)
	}
	ok, err := fits()
	if err != nil || ok {
		if err == nil {
			err = keep(terminating)
			c.cutGrace(w, cuttable)
			c.held = w
			c.countPending(w)
			c.verdict(&Verdict{Workload: w, Reason: ReasonReclaiming, Message: fmt.Sprintf("%s; waiting for evicted workloads to end: %s", fitMsg, c.describeEnding(w, terminating))})
		}
		return err == nil, "", err
	}
	// Queues are judged by what they keep: workloads being deleted do not
	// count towards the quota a victim's queue must stay at.
	for _, a := range terminating {
		if a.leaf != nil && a.leaf.Invalid == "" {
			queue.Release(a.leaf, a.Charge)
			defer queue.Charge(a.leaf, a.Charge)
		}
	}
	release := func(a *Workload) { free(a); queue.Release(a.leaf, a.Charge) }
	restore := func(a *Workload) { hold(a); queue.Charge(a.leaf, a.Charge) }
	// choose finds the fewest of cands (in their order) whose eviction
	// makes the workload fit; they are left released (freed, uncharged).
	// When none do, the books are as they were.
	choose := func(cands []*Workload) ([]*Workload, bool, error) {
		var victims []*Workload
		found := false
		var err error
		for _, a := range cands {
			if !queue.CanGive(a.leaf, queue.CommonAncestor(a.leaf, w.leaf), a.Charge) {
				continue
			}
			release(a)
			victims = append(victims, a)
			if found, err = fits(); err != nil || found {
				break
			}
		}
		if err != nil || !found {
			for _, v := range victims {
				restore(v)
			}
			return nil, false, err
		}
		// Keep the set minimal: put back what is not needed, last chosen first.
		for i := len(victims) - 1; i >= 0 && len(victims) > 1; i-- {
			restore(victims[i])
			ok, err := fits()
			if err != nil {
				// Leave the books as they were: the workload is set aside
				// (decideIsolated), the cycle goes on.
				for j, v := range victims {
					if j != i {
						restore(v)
					}
				}
				return nil, false, err
			}
			if ok {
				victims = append(victims[:i], victims[i+1:]...)
				continue
			}
			release(victims[i])
		}
		return victims, true, nil
	}
	sortVictims(candidates)
	sortVictims(forceable)
	victims, found, err := choose(candidates)
	if err == nil && !found && len(forceable) > 0 {
		// Only victims a budget protected can make room: the honoured
		// ones first, so that the fewest budgets are passed.
		victims, found, err = choose(append(append([]*Workload(nil), candidates...), forceable...))
	}
	if err != nil || !found {
		for _, a := range terminating {
			hold(a)
		}
		return false, why, err
	}
	for _, v := range victims {
		queue.Charge(v.leaf, v.Charge) // charged until its pods are gone
	}
	if err := keep(append(terminating, victims...)); err != nil {
		return false, "", err
	}
	forced := map[*Workload]bool{}
	for _, v := range forceable {
		forced[v] = true
	}
	grace := c.e.cfg.reclaimGrace()
	var names []string
	for _, v := range victims {
		v.Terminating = true
		name := fmt.Sprintf("%s (queue %s)", v.DescribeTo(w.Namespace), v.leaf.Name)
		if forced[v] {
			name += " past its disruption budget"
		}
		names = append(names, name)
		c.dec.Evict = append(c.dec.Evict, &Eviction{
			Workload: v, Pods: v.Pods, Reason: ReasonReclaimed, For: w, GracePeriod: grace, Force: forced[v],
			Message: fmt.Sprintf("reclaimed for %s in queue %s, which is within its quota: queue %s is over its quota; grace period at most %s",
				w.DescribeTo(v.Namespace), w.leaf.Name, v.leaf.Name, grace),
		})
	}
	c.cutGrace(w, cuttable)
	c.held = w
	c.countPending(w)
	c.verdict(&Verdict{Workload: w, Reason: ReasonReclaiming, Message: fmt.Sprintf("%s; reclaiming from over-quota queues: evicting %s (grace period at most %s)%s",
		fitMsg, strings.Join(names, ", "), grace, waitingToo(c.describeEnding(w, terminating)))})
	return true, "", nil
}

func waitingToo(s string) string {
	if s == "" {
		return ""
	}
	return "; also waiting for " + s
}

// endedKey names the claims of pods that ended, as one going workload.
const endedKey = "(ended)"

// endingAllocations are the allocations of claims reserved only for
// queued pods that ended (or, reserved for nobody, owned by one): the
// resourceclaim controller releases them in a moment. Claims a pod
// outside the snapshot (not queued) reserves are not known to end.
func (c *cycle) endingAllocations() []holding {
	ended := map[types.UID]bool{}
	for _, p := range c.snap.Pods {
		if terminal(p) {
			ended[p.UID] = true
		}
	}
	if len(ended) == 0 {
		return nil
	}
	var out []holding
	for _, cl := range c.snap.Claims {
		a := cl.Status.Allocation
		if a == nil {
			continue
		}
		gone := len(cl.Status.ReservedFor) > 0
		for _, r := range cl.Status.ReservedFor {
			gone = gone && r.Resource == "pods" && ended[r.UID]
		}
		if len(cl.Status.ReservedFor) == 0 {
			for _, o := range cl.OwnerReferences {
				gone = gone || (o.Kind == "Pod" && ended[o.UID])
			}
		}
		if !gone {
			continue
		}
		if sn := c.placer.nodeOf(a); sn != nil {
			out = append(out, holding{sn, a})
		}
	}
	return out
}

// reclaimable says whether reclaim may evict a for w: another queue's
// workload, admitted by Tessera, holding devices, while its queue is over
// its quota.
func (c *cycle) reclaimable(a, w *Workload) bool {
	return !a.adopted && a.leaf != nil && a.leaf.Invalid == "" && a.leaf != w.leaf && len(a.holdings) > 0 && a.leaf.OverQuota()
}

// refusal is the latest refused eviction of a's pods; a refusal that is
// not a budget's wins (nothing gets past it).
func (c *cycle) refusal(a *Workload) (Refusal, bool) {
	var out Refusal
	found := false
	for _, p := range a.Pods {
		r, ok := c.snap.Refused[p.UID]
		if !ok {
			continue
		}
		if !found || (out.Budget && !r.Budget) || (out.Budget == r.Budget && r.At.After(out.At)) {
			out = r
		}
		found = true
	}
	return out, found
}

// refusedNote tells a workload that reclaim passes over victims whose
// eviction was refused, by queue and time only (never another namespace's
// pod names).
func (c *cycle) refusedNote(w *Workload, blocked []*Workload) string {
	if len(blocked) == 0 {
		return ""
	}
	sortVictims(blocked)
	var parts []string
	for i, v := range blocked {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("%d more", len(blocked)-i))
			break
		}
		r, _ := c.refusal(v)
		by := "the API server"
		if r.Budget {
			by = "a disruption budget"
		}
		parts = append(parts, fmt.Sprintf("%s (queue %s) at %s by %s", v.DescribeTo(w.Namespace), v.leaf.Name, r.At.UTC().Format(time.RFC3339), by))
	}
	return fmt.Sprintf("; reclaim passes over over-quota workloads whose eviction was refused (%s) and no others make room: "+
		"nothing is held for this workload meanwhile, and the evictions are tried again later", strings.Join(parts, ", "))
}

// describeEnding names the terminating workloads a reclaim waits for, with
// when each must have ended (its pods' latest deletion deadline).
func (c *cycle) describeEnding(w *Workload, ending []*Workload) string {
	sorted := append([]*Workload(nil), ending...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Key < sorted[j].Key })
	var parts []string
	for i, a := range sorted {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("%d more", len(sorted)-i))
			break
		}
		if a.Key == endedKey {
			parts = append(parts, "the devices of pods that ended, being released")
			continue
		}
		name := a.DescribeTo(w.Namespace)
		if a.leaf != nil {
			name += " (queue " + a.leaf.Name + ")"
		}
		if d := deadline(a.Pods); !d.IsZero() {
			name += ", due to end by " + d.UTC().Format(time.RFC3339)
		}
		parts = append(parts, name)
	}
	return strings.Join(parts, ", ")
}

// stuckAfter is how long past its deletion deadline a terminating pod is
// still waited for (the kubelet stops it, the claims are released): after
// that it is stuck (a lost node), and reclaim no longer holds anything for
// it.
const stuckAfter = 2 * time.Minute

// endsSoon says whether reclaim may count the terminating workload a as
// gone: its pods' deletion deadline lies within the reclaim grace period
// (or reclaim cuts it to that: cut) and not more than stuckAfter in the
// past. A pod without a deadline (not deleting) does not hold it back.
func (c *cycle) endsSoon(a *Workload, cut bool) bool {
	d := deadline(a.Pods)
	if d.IsZero() {
		return true
	}
	if d.Before(c.now.Add(-stuckAfter)) {
		return false
	}
	return cut || !d.After(c.now.Add(c.e.cfg.reclaimGrace()))
}

// deadline is the latest deletion deadline of the pods being deleted.
func deadline(pods []*corev1.Pod) time.Time {
	var d time.Time
	for _, p := range pods {
		if p.DeletionTimestamp != nil && p.DeletionTimestamp.After(d) {
			d = p.DeletionTimestamp.Time
		}
	}
	return d
}

// cutGrace evicts again the pods of terminating workloads that reclaim
// could have evicted for w (over-quota queues, judged before anything
// terminating is released: reclaimable) and whose deletion
// deadline lies further out than the reclaim grace period: a tenant's own
// long-grace delete does not hold the workload back longer than an
// eviction would. A pod's own delete of a queue within its quota is left
// alone. The Eviction API deletes a terminating pod without consulting
// budgets, and a shorter grace period moves its deadline closer.
func (c *cycle) cutGrace(w *Workload, terminating []*Workload) {
	// terminating: the reclaimable ones only.
	grace := c.e.cfg.reclaimGrace()
	limit := c.now.Add(grace)
	for _, a := range terminating {
		var pods []*corev1.Pod
		for _, p := range a.Pods {
			g := p.DeletionGracePeriodSeconds
			if p.DeletionTimestamp != nil && g != nil && *g > int64(grace/time.Second) && p.DeletionTimestamp.After(limit) {
				pods = append(pods, p)
			}
		}
		if len(pods) == 0 {
			continue
		}
		c.dec.Evict = append(c.dec.Evict, &Eviction{
			Workload: a, Pods: pods, Reason: ReasonReclaimed, For: w, GracePeriod: grace,
			Message: fmt.Sprintf("being deleted with a grace period longer than %s while %s in queue %s, which is within its quota, waits for its devices: queue %s is over its quota; grace period cut to at most %s",
				grace, w.DescribeTo(a.Namespace), w.leaf.Name, a.leaf.Name, grace),
		})
	}
}

// sortVictims orders reclaim candidates: lowest pod priority first, then
// the queue that used more recently (time-based fair share), then the
// most recently admitted.
func sortVictims(ws []*Workload) {
	sort.SliceStable(ws, func(i, j int) bool {
		a, b := ws[i], ws[j]
		if a.Priority != b.Priority {
			return a.Priority < b.Priority
		}
		// Time-based fair share: the queue that used more recently gives first.
		if o := queue.ReclaimOrder(a.leaf, b.leaf); o != 0 {
			return o < 0
		}
		if !a.AdmittedAt.Equal(b.AdmittedAt) {
			return a.AdmittedAt.After(b.AdmittedAt)
		}
		return a.Key > b.Key
	})
}
