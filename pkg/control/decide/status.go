package decide

import (
	"context"
	"time"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/queue"
)

// QueueStatuses is the outcome of a status refresh (Engine.Status).
type QueueStatuses struct {
	// Queues is the status of every queue, by name, as Decision.Queues.
	Queues   map[string]*v1alpha1.QueueStatus
	Duration time.Duration
}

// Status recomputes every queue's status from snap without deciding: what
// admitted workloads hold (allocated claims at their allocation, claims
// admitted but not yet allocated at the engine's reservation or, without
// one, their estimate), the memory they use, the admitted and pending
// counts, pending demand and fair shares. It places nothing (no node is
// simulated, no allocator runs), admits and evicts nothing, and leaves the
// engine's reservations as they are; the catalog of devices it keeps
// while the slices and classes are the same objects, so it costs a walk
// over the pods and claims. The controller runs it instead of a cycle when no
// pod is gated: with nothing pending, Decide would charge the same.
func (e *Engine) Status(ctx context.Context, snap *Snapshot) (*QueueStatuses, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	start := time.Now()
	// The catalog is kept for the next refresh or cycle, as Decide keeps
	// it (the slices as listed: DeviceTaintRules change no charge).
	c, pending, err := e.open(ctx, snap, false)
	if err != nil {
		return nil, err
	}
	for _, w := range pending {
		if w.problem != "" || w.leaf == nil {
			continue // invalid: counted nowhere, as in Decide
		}
		c.countPending(w)
		if w.wait != "" {
			continue
		}
		if d, v := c.resolveDemand(w); v == nil {
			queue.AddPending(w.leaf, d)
		}
	}
	c.tree.ComputeFairShare(c.cat.Capacity())
	c.queueStatus()
	return &QueueStatuses{Queues: c.dec.Queues, Duration: time.Since(start)}, nil
}

// queueStatus records the status of every queue in the decision: what it
// holds, its pending demand and fair share, its workload counts and, when
// a claim of it is sampled, the memory its workloads use.
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

// list is v as a resource list, every resource named.
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
