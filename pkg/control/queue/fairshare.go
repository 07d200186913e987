package queue

import (
	"math"
	"sort"
	"strconv"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// ComputeFairShare divides capacity among the queues, KAI style, for every
// resource on its own:
//
//  1. Each sibling gets min(quota, request), where request is what its
//     subtree holds plus what it waits for, capped by its limit.
//  2. What is left goes to the siblings of the highest priority first,
//     split by over-quota weight and never beyond a queue's capped request;
//     leftovers (queues that need less than their part) are split again
//     among the others; then the next priority bucket.
//  3. Each queue's fair share is divided among its children the same way.
//
// Invalid queues (unknown parent, cycles) get nothing.
func (t *Tree) ComputeFairShare(capacity Vector) {
	for _, q := range t.Queues {
		q.FairShare = Vector{}
	}
	var roots []*Queue
	for _, r := range t.Roots {
		if r.Invalid == "" {
			roots = append(roots, r)
		}
	}
	divide(roots, capacity)
}

func divide(siblings []*Queue, amount Vector) {
	if len(siblings) == 0 {
		return
	}
	for r := range NumResources {
		divideResource(siblings, Resource(r), amount[r])
	}
	for _, q := range siblings {
		divide(q.Children, q.FairShare)
	}
}

func request(q *Queue, r Resource) int64 {
	req := satAdd(q.Allocated[r], q.Pending[r])
	if q.Limit[r] != NoLimit {
		req = min(req, q.Limit[r])
	}
	return max(req, 0)
}

// weightScale keeps usage-weighted weights integral: a weight w becomes
// round(w * weightScale / (1 + k*share)).
const weightScale = 1_000_000

// effectiveWeights are the siblings' over-quota weights for resource r.
// Without time-based fair share on their parent they are the weights; with
// it, weight / (1 + factor * share), where share is the sibling's part of
// the siblings' decayed allocated usage (status.usage.decayed), so a
// child that held more recently gets less of what is free.
func effectiveWeights(siblings []*Queue, r Resource) map[*Queue]int64 {
	out := make(map[*Queue]int64, len(siblings))
	p := siblings[0].Parent
	var total float64
	for _, q := range siblings {
		out[q] = q.Weight[r]
		total += q.DecayedUsage[r]
	}
	if p == nil || p.UsageFactor <= 0 || total <= 0 {
		return out
	}
	for _, q := range siblings {
		out[q] = int64(math.Round(float64(q.Weight[r]) * weightScale / (1 + p.UsageFactor*q.DecayedUsage[r]/total)))
	}
	return out
}

// UsageShare is the queue's part (0 to 1) of its siblings' decayed
// allocated usage of resource r, the largest over the resources; 0 when its
// parent does not weigh usage.
func UsageShare(q *Queue) float64 {
	if q.Parent == nil || q.Parent.UsageFactor <= 0 {
		return 0
	}
	share := 0.0
	for r := range NumResources {
		var total float64
		for _, s := range q.Parent.Children {
			total += s.DecayedUsage[r]
		}
		if total > 0 {
			share = max(share, q.DecayedUsage[r]/total)
		}
	}
	return share
}

// ReclaimOrder compares two over-quota leaves as sources of reclaim: under
// their closest common ancestor that weighs usage, the side whose child of
// that ancestor used more recently (UsageShare) gives first. It returns
// -1 when a gives first, 1 when b does, 0 when usage does not decide.
func ReclaimOrder(a, b *Queue) int {
	if a == nil || b == nil || a == b {
		return 0
	}
	anc := CommonAncestor(a, b)
	if anc == nil || anc.UsageFactor <= 0 {
		return 0
	}
	ca, cb := childUnder(a, anc), childUnder(b, anc)
	if ca == nil || cb == nil {
		return 0
	}
	sa, sb := UsageShare(ca), UsageShare(cb)
	switch {
	case sa > sb:
		return -1
	case sa < sb:
		return 1
	}
	return 0
}

// childUnder is the ancestor of q (or q) whose parent is anc.
func childUnder(q, anc *Queue) *Queue {
	for n := q; n != nil; n = n.Parent {
		if n.Parent == anc {
			return n
		}
	}
	return nil
}

func divideResource(siblings []*Queue, r Resource, amount int64) {
	remaining := amount
	// Phase 1: quotas, regardless of priority.
	for _, q := range siblings {
		give := min(q.Quota[r], request(q, r))
		q.FairShare[r] = give
		remaining -= give
	}
	if remaining <= 0 {
		return
	}
	// Phase 2: priority buckets, highest first; weights within a bucket.
	weights := effectiveWeights(siblings, r)
	byPrio := append([]*Queue(nil), siblings...)
	sort.SliceStable(byPrio, func(i, j int) bool { return byPrio[i].Priority > byPrio[j].Priority })
	for start := 0; start < len(byPrio) && remaining > 0; {
		end := start
		for end < len(byPrio) && byPrio[end].Priority == byPrio[start].Priority {
			end++
		}
		remaining = waterFill(byPrio[start:end], r, remaining, weights)
		start = end
	}
}

// waterFill splits amount among the bucket by weight, capped by each
// queue's request, repeating with what capped queues leave; it returns
// what nobody in the bucket wants.
func waterFill(bucket []*Queue, r Resource, amount int64, weights map[*Queue]int64) int64 {
	for amount > 0 {
		var active []*Queue
		var totalWeight int64
		for _, q := range bucket {
			if weights[q] > 0 && q.FairShare[r] < request(q, r) {
				active = append(active, q)
				totalWeight = satAdd(totalWeight, weights[q])
			}
		}
		if len(active) == 0 {
			return amount
		}
		var given int64
		for _, q := range active {
			part := mulDiv(amount, weights[q], totalWeight)
			part = min(part, request(q, r)-q.FairShare[r])
			q.FairShare[r] += part
			given += part
		}
		if given == 0 {
			// Less than one unit per weight is left: hand out single
			// units in order so the total still adds up.
			for _, q := range active {
				if amount == 0 {
					break
				}
				q.FairShare[r]++
				amount--
			}
			continue
		}
		amount -= given
	}
	return amount
}

// DominantShare is the queue's largest allocated / fair-share ratio over
// the accounted resources (KAI's saturation ratio, taken over the dominant
// resource). A queue holding something it has no fair share of is
// infinitely saturated; one holding nothing has share 0.
func (q *Queue) DominantShare() float64 {
	return DominantShareOf(q.Allocated, q.FairShare)
}

// DominantShareOf computes the dominant share of an allocation against a
// fair share.
func DominantShareOf(allocated, fairShare Vector) float64 {
	share := 0.0
	for r := range NumResources {
		a, f := allocated[r], fairShare[r]
		switch {
		case a <= 0:
		case f <= 0:
			return math.Inf(1)
		default:
			share = max(share, float64(a)/float64(f))
		}
	}
	return share
}

// Before orders sibling queues for admission: higher priority first, then
// the lower dominant share, then the name.
func Before(a, b *Queue) bool {
	if a.Priority != b.Priority {
		return a.Priority > b.Priority
	}
	sa, sb := a.DominantShare(), b.DominantShare()
	if sa != sb {
		return sa < sb
	}
	return a.Name < b.Name
}

func parseDecimal(d v1alpha1.Decimal) float64 {
	v, err := strconv.ParseFloat(string(d), 64)
	if err != nil || v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}
