package decide

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/podclaims"
	"github.com/tessera-dev/tessera/pkg/control/queue"
)

// Reasons of the charge rules (docs/controller.md, "Charges").
const (
	// ReasonOverLimit: an admitted pod holds more than it was admitted
	// with, and its queue cannot take the difference: it is evicted.
	ReasonOverLimit = "OverLimit"
	// ReasonClaimInAnotherQueue: a claim of the pod is used by a pod of
	// another queue (or of none).
	ReasonClaimInAnotherQueue = "ClaimInAnotherQueue"
	// ReasonWaitingForGates: the pod has scheduling gates other than
	// Tessera's; it is admitted once they are gone.
	ReasonWaitingForGates = "WaitingForGates"
)

// FormatCharge is the value of v1alpha1.AdmittedChargeAnnotation.
func FormatCharge(v queue.Vector) string {
	return fmt.Sprintf("memory=%d,gpus=%d", v[queue.Memory], v[queue.GPUs])
}

// ParseCharge reads v1alpha1.AdmittedChargeAnnotation.
func ParseCharge(s string) (queue.Vector, error) {
	var v queue.Vector
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		k, val, ok := strings.Cut(part, "=")
		n, err := strconv.ParseInt(val, 10, 64)
		if !ok || err != nil || n < 0 || seen[k] {
			return queue.Vector{}, fmt.Errorf("malformed charge %q", s)
		}
		seen[k] = true
		switch k {
		case "memory":
			v[queue.Memory] = n
		case "gpus":
			v[queue.GPUs] = n
		default:
			return queue.Vector{}, fmt.Errorf("malformed charge %q", s)
		}
	}
	if len(seen) != int(queue.NumResources) {
		return queue.Vector{}, fmt.Errorf("malformed charge %q", s)
	}
	return v, nil
}

// otherGates lists the pod's scheduling gates that are not Tessera's.
func otherGates(p *corev1.Pod) []string {
	var out []string
	for _, g := range p.Spec.SchedulingGates {
		if g.Name != v1alpha1.AdmissionGate {
			out = append(out, g.Name)
		}
	}
	return out
}

// adopt returns, for every namespace labelled with a queue (a managed
// namespace), one admitted workload per pod there that holds claims and is
// in no queue: pods that were running when the namespace became managed
// (pods created later get the label from the webhook). They are found
// through the claims' reservedFor (the controller's cache holds only
// labelled pods), charged to the namespace's queue and counted in its
// status, never reclaimed or evicted: Tessera never admitted them.
func (c *cycle) adopt() []*Workload {
	managed := map[string]string{}
	for _, ns := range c.snap.Namespaces {
		if q := ns.Labels[v1alpha1.QueueLabel]; q != "" {
			managed[ns.Name] = q
		}
	}
	if len(managed) == 0 {
		return nil
	}
	known := map[types.UID]bool{}
	for _, p := range c.snap.Pods {
		known[p.UID] = true
	}
	pods := map[types.UID]*corev1.Pod{}
	var order []types.UID
	for _, cl := range c.snap.Claims {
		q, ok := managed[cl.Namespace]
		if !ok || cl.Status.Allocation == nil {
			continue
		}
		for _, r := range cl.Status.ReservedFor {
			if r.Resource != "pods" || r.APIGroup != "" || known[r.UID] {
				continue
			}
			p := pods[r.UID]
			if p == nil {
				p = &corev1.Pod{}
				p.Namespace, p.Name, p.UID = cl.Namespace, r.Name, r.UID
				p.Labels = map[string]string{v1alpha1.QueueLabel: q}
				pods[r.UID] = p
				order = append(order, r.UID)
			}
			name := cl.Name
			p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: fmt.Sprintf("c%d", len(p.Spec.ResourceClaims)), ResourceClaimName: &name})
		}
	}
	sort.Slice(order, func(i, j int) bool {
		a, b := pods[order[i]], pods[order[j]]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	var out []*Workload
	for _, uid := range order {
		p := pods[uid]
		w := &Workload{Key: p.Namespace + "/" + p.Name + "@adopted", Namespace: p.Namespace, Name: p.Name, Admitted: true, Pods: []*corev1.Pod{p}, adopted: true}
		validate(w, w.Pods, c.tree)
		w.problem = ""
		out = append(out, w)
	}
	return out
}

// claimConflicts applies the rule for claims shared across queues: a
// pending workload whose claim is used by a live pod of another queue (or
// of none: a pod without a queue, or one the claim's reservedFor names and
// no queue knows) waits with a reason, unless all users share its queue.
// The charge of a shared claim stays with the workload that admitted it
// (the earliest admitted user) for as long as any user runs.
func (c *cycle) claimConflicts(pending, admitted []*Workload) {
	users := map[string]map[string]bool{} // claim key -> queues
	live := map[types.UID]bool{}
	add := func(key, q string) {
		if users[key] == nil {
			users[key] = map[string]bool{}
		}
		users[key][q] = true
	}
	addPod := func(p *corev1.Pod, q string) {
		live[p.UID] = true
		pcs, err := podclaims.PodClaims(p, c.objs)
		if err != nil {
			// Resolve what exists: a missing claim has no users to share.
			return
		}
		for _, pc := range pcs {
			if pc.Exists {
				add(pc.Key, q)
			}
		}
	}
	for _, ws := range [][]*Workload{admitted, pending} {
		for _, w := range ws {
			for _, p := range w.Pods {
				addPod(p, p.Labels[v1alpha1.QueueLabel])
			}
		}
	}
	// Pods the snapshot lists but no workload holds (terminal ones) do not
	// use their claims any more.
	for _, p := range c.snap.Pods {
		if terminal(p) {
			live[p.UID] = true // known, not a user
		}
	}
	for _, cl := range c.snap.Claims {
		for _, r := range cl.Status.ReservedFor {
			if r.Resource == "pods" && r.APIGroup == "" && !live[r.UID] {
				add("claim:"+cl.Namespace+"/"+cl.Name, "")
			}
		}
	}
	for _, w := range pending {
		if w.problem != "" || w.wait != "" {
			continue
		}
		var bad []string
		seen := map[string]bool{}
		for _, p := range w.Pods {
			pcs, err := podclaims.PodClaims(p, c.objs)
			if err != nil {
				continue // resolveDemand says so
			}
			for _, pc := range pcs {
				if seen[pc.Key] {
					continue
				}
				seen[pc.Key] = true
				for q := range users[pc.Key] {
					if q != w.QueueName {
						bad = append(bad, pc.Display)
						break
					}
				}
			}
		}
		if len(bad) > 0 {
			sort.Strings(bad)
			w.wait = fmt.Sprintf("%s: claim %s is already used by a pod of another queue (or of none); pods sharing a claim must be in one queue", w.Describe(), strings.Join(bad, ", "))
			w.waitWhy = ReasonClaimInAnotherQueue
		}
	}
}

// podHolds is what the pod's claims hold now, every claim counted whole
// (shared or not): the allocation, else the reservation, else the
// estimate. ok is false when a claim of the pod is missing.
func (c *cycle) podHolds(p *corev1.Pod, pcs []podclaims.PodClaim) queue.Vector {
	var v queue.Vector
	for _, pc := range pcs {
		switch r := c.e.reservations[pc.Key]; {
		case pc.Allocated():
			v = v.Add(c.cat.ChargeAllocation(pc.Claim.Status.Allocation))
		case r != nil:
			v = v.Add(r.charge)
		case pc.Claim != nil:
			v = v.Add(c.estimate(pc).v)
		}
	}
	return v
}

// recordHolds fills what each admitted pod's claims were charged at
// admission (Admission.Holds); the controller records it on the pod.
func (c *cycle) recordHolds() {
	for _, ad := range c.dec.Admit {
		ad.Holds = map[types.UID]queue.Vector{}
		for _, p := range ad.Pods {
			ad.Holds[p.UID] = c.podHolds(p, ad.Workload.claims[p])
		}
	}
}

// checkHoldings checks admitted workloads whose pods hold more than they
// were admitted with (v1alpha1.AdmittedChargeAnnotation): a claim recreated
// bigger under the same name, an allocation bigger than the simulation's.
// Earliest admitted first, each workload's growth is checked against the
// limits of every queue up its hierarchy as a new admission would be; a
// workload whose growth fits keeps running (charged what it holds), one
// whose growth does not is evicted whole with reason OverLimit (charged
// until its pods are gone). Pods without the annotation (admitted by an
// older controller, adopted) are charged what they hold and not checked.
func (c *cycle) checkHoldings() {
	type grown struct {
		w      *Workload
		excess queue.Vector
		pods   []string
	}
	var list []grown
	for _, w := range c.admitted {
		if w.Terminating || w.adopted || w.leaf == nil || w.leaf.Invalid != "" {
			continue
		}
		var g grown
		for _, p := range w.Pods {
			pcs, ok := w.claims[p]
			s, has := p.Annotations[v1alpha1.AdmittedChargeAnnotation]
			if !ok || !has {
				continue
			}
			rec, err := ParseCharge(s)
			if err != nil {
				rec = queue.Vector{} // unreadable: judge everything it holds
			}
			holds := c.podHolds(p, pcs)
			var ex queue.Vector
			for r := range queue.NumResources {
				ex[r] = max(holds[r]-rec[r], 0)
			}
			if !ex.IsZero() {
				g.excess = g.excess.Add(ex)
				g.pods = append(g.pods, p.Name)
			}
		}
		if len(g.pods) > 0 {
			g.w = w
			list = append(list, g)
		}
	}
	if len(list) == 0 {
		return
	}
	for _, g := range list {
		queue.Release(g.w.leaf, g.excess)
	}
	for _, g := range list { // c.admitted is in admission order
		v := queue.CheckLimits(g.w.leaf, g.excess)
		queue.Charge(g.w.leaf, g.excess)
		if v == nil {
			continue
		}
		w := g.w
		w.Terminating = true
		msg := fmt.Sprintf("%s holds more than it was admitted with (pod %s: %s more); checked again: %s", w.Describe(), strings.Join(g.pods, ", "), g.excess, v.Message(w.leaf))
		c.dec.Evict = append(c.dec.Evict, &Eviction{Workload: w, Pods: w.Pods, Reason: ReasonOverLimit, Message: msg})
	}
}
