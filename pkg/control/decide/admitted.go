package decide

import (
	"maps"
	"sort"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/podclaims"
	"github.com/tessera-dev/tessera/pkg/control/queue"
)

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
