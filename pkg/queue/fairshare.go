package queue

import (
	"math"
	"sort"
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
	byPrio := append([]*Queue(nil), siblings...)
	sort.SliceStable(byPrio, func(i, j int) bool { return byPrio[i].Priority > byPrio[j].Priority })
	for start := 0; start < len(byPrio) && remaining > 0; {
		end := start
		for end < len(byPrio) && byPrio[end].Priority == byPrio[start].Priority {
			end++
		}
		remaining = waterFill(byPrio[start:end], r, remaining)
		start = end
	}
}

// waterFill splits amount among the bucket by weight, capped by each
// queue's request, repeating with what capped queues leave; it returns
// what nobody in the bucket wants.
func waterFill(bucket []*Queue, r Resource, amount int64) int64 {
	for amount > 0 {
		var active []*Queue
		var totalWeight int64
		for _, q := range bucket {
			if q.Weight[r] > 0 && q.FairShare[r] < request(q, r) {
				active = append(active, q)
				totalWeight = satAdd(totalWeight, q.Weight[r])
			}
		}
		if len(active) == 0 {
			return amount
		}
		var given int64
		for _, q := range active {
			part := mulDiv(amount, q.Weight[r], totalWeight)
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
