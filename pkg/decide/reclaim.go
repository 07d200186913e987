package decide

import (
	"fmt"
	"sort"
	"strings"

	"github.com/tessera-dev/tessera/pkg/queue"
)

// reclaim handles a workload within quota that does not fit: when the
// over-quota workloads of other queues hold what it needs, it evicts the
// fewest of them (lowest priority, most recently admitted first; gangs
// whole), never taking a queue below its quota. Workloads already being
// deleted count as gone. The workload is admitted in a later cycle, once
// what it needs is free (admitting it onto devices still held would let the
// scheduler hand the rest of them to others first); for the rest of this
// cycle its future place is kept from other work and over-quota work waits.
// It returns true when it recorded a verdict.
func (c *cycle) reclaim(w *Workload, fitMsg string) (bool, error) {
	var terminating, candidates []*Workload
	for _, a := range c.admitted {
		switch {
		case a.Terminating:
			terminating = append(terminating, a)
		case a.adopted:
			// Never admitted by Tessera: charged, not reclaimed.
		case a.leaf != nil && a.leaf.Invalid == "" && a.leaf != w.leaf && len(a.holdings) > 0 && a.leaf.OverQuota():
			candidates = append(candidates, a)
		}
	}
	if len(terminating) == 0 && len(candidates) == 0 {
		return false, nil
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
			c.held = w
			c.countPending(w)
			c.verdict(&Verdict{Workload: w, Reason: ReasonReclaiming, Message: fmt.Sprintf("%s; waiting for evicted workloads to end", fitMsg)})
		}
		return err == nil, err
	}
	// Queues are judged by what they keep: workloads being deleted do not
	// count towards the quota a victim's queue must stay at.
	for _, a := range terminating {
		if a.leaf != nil && a.leaf.Invalid == "" {
			queue.Release(a.leaf, a.Charge)
			defer queue.Charge(a.leaf, a.Charge)
		}
	}
	sort.SliceStable(candidates, func(i, j int) bool {
		a, b := candidates[i], candidates[j]
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
	release := func(a *Workload) { free(a); queue.Release(a.leaf, a.Charge) }
	restore := func(a *Workload) { hold(a); queue.Charge(a.leaf, a.Charge) }
	var victims []*Workload
	found := false
	for _, a := range candidates {
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
		for _, a := range terminating {
			hold(a)
		}
		return false, err
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
			for _, a := range terminating {
				hold(a)
			}
			return false, err
		}
		if ok {
			victims = append(victims[:i], victims[i+1:]...)
			continue
		}
		release(victims[i])
	}
	for _, v := range victims {
		queue.Charge(v.leaf, v.Charge) // charged until its pods are gone
	}
	if err := keep(append(terminating, victims...)); err != nil {
		return false, err
	}
	var names []string
	for _, v := range victims {
		v.Terminating = true
		names = append(names, fmt.Sprintf("%s (queue %s)", v.DescribeTo(w.Namespace), v.leaf.Name))
		c.dec.Evict = append(c.dec.Evict, &Eviction{
			Workload: v, Pods: v.Pods, Reason: ReasonReclaimed,
			Message: fmt.Sprintf("reclaimed for %s in queue %s, which is within its quota: queue %s is over its quota", w.DescribeTo(v.Namespace), w.leaf.Name, v.leaf.Name),
		})
	}
	c.held = w
	c.countPending(w)
	c.verdict(&Verdict{Workload: w, Reason: ReasonReclaiming, Message: fmt.Sprintf("%s; reclaiming from over-quota queues: evicting %s", fitMsg, strings.Join(names, ", "))})
	return true, nil
}
