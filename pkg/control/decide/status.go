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
	// Kept for the next refresh or cycle, as Decide keeps it (the slices
	// as listed: DeviceTaintRules change no charge).
	e.keepCatalog(snap)
	c := e.newCycle(ctx, snap, e.catalog, nil)
	workloads := append(groupWorkloads(snap.Pods, c.tree), c.adopt()...)
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
