// Package whatif predicts what the controller would decide after a
// change (queues, nodes, decision flags) by running the decision engine
// twice on one snapshot, as it is and with the change, and comparing the
// outcomes per workload: `kubectl tessera what-if` live or from a saved
// snapshot; the shadow controller reads its queue overrides with it.
package whatif

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/pkg/control/decide"
)

// Outcomes of a workload in one cycle.
const (
	Start   = "start"
	Wait    = "wait"
	Reclaim = "reclaimed"
)

// Outcome is what one cycle does with one workload.
type Outcome struct {
	Queue, Workload string
	Pods            int
	// What is Start, Wait or Reclaim.
	What            string
	Reason, Message string
}

// Result is one cycle's outcomes, by workload key.
type Result struct {
	Outcomes map[string]Outcome
	Stats    decide.Stats
}

// Decide runs one admission cycle on the state with a fresh engine (the
// reservations of admitted but unallocated claims rebuilt from the state,
// as a restarted controller does).
func Decide(ctx context.Context, s *decide.Snapshot, cfg decide.Config) (*Result, error) {
	d, err := decide.NewEngine(cfg).Decide(ctx, s)
	if err != nil {
		return nil, err
	}
	return Outcomes(d), nil
}

// Outcomes lists a decision's admissions, waits and evictions.
func Outcomes(d *decide.Decision) *Result {
	r := &Result{Outcomes: map[string]Outcome{}, Stats: d.Stats}
	for _, a := range d.Admit {
		r.Outcomes[a.Workload.Key] = Outcome{Queue: a.Workload.QueueName, Workload: a.Workload.Key, Pods: len(a.Pods), What: Start, Reason: decide.ReasonAdmitted, Message: a.Message}
	}
	for _, v := range d.Waiting {
		r.Outcomes[v.Workload.Key] = Outcome{Queue: v.Workload.QueueName, Workload: v.Workload.Key, Pods: len(v.Workload.Pods), What: Wait, Reason: v.Reason, Message: v.Message}
	}
	for _, e := range d.Evict {
		reason := e.Reason
		if reason == "" {
			reason = decide.ReasonReclaimed
		}
		r.Outcomes[e.Workload.Key] = Outcome{Queue: e.Workload.QueueName, Workload: e.Workload.Key, Pods: len(e.Pods), What: Reclaim, Reason: reason, Message: e.Message}
	}
	return r
}

// Comparison is a what-if run: the cycle before and after the change.
type Comparison struct {
	Before, After *Result
	// Removed are the pods bound to removed nodes.
	Removed []*corev1.Pod
}

// Run decides the state as it is (with before) and with the change.
func Run(ctx context.Context, s *decide.Snapshot, before decide.Config, c Change) (*Comparison, error) {
	b, err := Decide(ctx, s, before)
	if err != nil {
		return nil, fmt.Errorf("before: %w", err)
	}
	changed, removed, err := c.Apply(ctx, s)
	if err != nil {
		return nil, err
	}
	cfg := before
	if c.Config != nil {
		cfg = *c.Config
	}
	a, err := Decide(ctx, changed, cfg)
	if err != nil {
		return nil, fmt.Errorf("after: %w", err)
	}
	return &Comparison{Before: b, After: a, Removed: removed}, nil
}

// Changed lists the workloads whose outcome differs (a different outcome,
// or a different reason to wait), by queue then workload.
func (c *Comparison) Changed() []Moved {
	keys := map[string]bool{}
	for k := range c.Before.Outcomes {
		keys[k] = true
	}
	for k := range c.After.Outcomes {
		keys[k] = true
	}
	var out []Moved
	for k := range keys {
		b, inB := c.Before.Outcomes[k]
		a, inA := c.After.Outcomes[k]
		if inB && inA && b.What == a.What && b.Reason == a.Reason {
			continue
		}
		q := a.Queue
		if !inA {
			q = b.Queue
		}
		out = append(out, Moved{Queue: q, Workload: k, Before: ptrIf(b, inB), After: ptrIf(a, inA)})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Queue != out[j].Queue {
			return out[i].Queue < out[j].Queue
		}
		return out[i].Workload < out[j].Workload
	})
	return out
}

// Moved is a workload whose outcome the change moves (nil: none, e.g. a
// workload that runs on and is not decided).
type Moved struct {
	Queue, Workload string
	Before, After   *Outcome
}

func ptrIf(o Outcome, ok bool) *Outcome {
	if !ok {
		return nil
	}
	return &o
}

type counts struct{ start, wait, reclaim int }

func count(r *Result) map[string]*counts {
	m := map[string]*counts{}
	for _, o := range r.Outcomes {
		c := m[o.Queue]
		if c == nil {
			c = &counts{}
			m[o.Queue] = c
		}
		switch o.What {
		case Start:
			c.start++
		case Wait:
			c.wait++
		case Reclaim:
			c.reclaim++
		}
	}
	return m
}

// Print writes the comparison per queue: what would start, wait and be
// reclaimed before and after, then every workload whose outcome moves and
// why. With all, every workload's outcome after the change is listed.
func (c *Comparison) Print(w io.Writer, all bool) {
	before, after := count(c.Before), count(c.After)
	queues := map[string]bool{}
	for q := range before {
		queues[q] = true
	}
	for q := range after {
		queues[q] = true
	}
	names := make([]string, 0, len(queues))
	for q := range queues {
		names = append(names, q)
	}
	sort.Strings(names)
	changed := c.Changed()
	byQueue := map[string][]Moved{}
	for _, ch := range changed {
		byQueue[ch.Queue] = append(byQueue[ch.Queue], ch)
	}
	if len(c.Removed) > 0 {
		fmt.Fprintf(w, "Removed nodes take %d running pods with them (their owners would recreate them, gated):\n", len(c.Removed))
		for _, p := range c.Removed {
			fmt.Fprintf(w, "  %s/%s on %s (queue %s)\n", p.Namespace, p.Name, p.Spec.NodeName, queueOf(p))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%-24s %-26s %-26s\n", "QUEUE", "BEFORE start/wait/reclaim", "AFTER start/wait/reclaim")
	for _, q := range names {
		fmt.Fprintf(w, "%-24s %-26s %-26s\n", orNone(q), fmtCounts(before[q]), fmtCounts(after[q]))
	}
	fmt.Fprintln(w)
	if len(changed) == 0 {
		fmt.Fprintln(w, "No workload's outcome changes.")
	}
	for _, q := range names {
		if len(byQueue[q]) == 0 {
			continue
		}
		fmt.Fprintf(w, "Queue %s:\n", orNone(q))
		for _, ch := range byQueue[q] {
			fmt.Fprintf(w, "  %-40s %s -> %s\n", ch.Workload, short(ch.Before), short(ch.After))
			if ch.After != nil && ch.After.What != Start && ch.After.Message != "" {
				fmt.Fprintf(w, "      after:  %s\n", ch.After.Message)
			}
			if ch.Before != nil && ch.Before.What != Start && ch.Before.Message != "" {
				fmt.Fprintf(w, "      before: %s\n", ch.Before.Message)
			}
		}
	}
	if all {
		fmt.Fprintln(w, "\nAll outcomes after the change:")
		c.After.Print(w)
	}
}

func queueOf(p *corev1.Pod) string {
	for k, v := range p.Labels {
		if strings.HasSuffix(k, "/queue") {
			return v
		}
	}
	return "-"
}

func orNone(q string) string {
	if q == "" {
		return "(none)"
	}
	return q
}

func fmtCounts(c *counts) string {
	if c == nil {
		return "-"
	}
	return fmt.Sprintf("%d/%d/%d", c.start, c.wait, c.reclaim)
}

func short(o *Outcome) string {
	switch {
	case o == nil:
		return "not decided (runs on, or gone)"
	case o.What == Start:
		return "starts"
	case o.What == Reclaim:
		return "reclaimed (" + o.Reason + ")"
	default:
		return "waits (" + o.Reason + ")"
	}
}

// Print writes every outcome, by queue then workload.
func (r *Result) Print(w io.Writer) {
	keys := make([]string, 0, len(r.Outcomes))
	for k := range r.Outcomes {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := r.Outcomes[keys[i]], r.Outcomes[keys[j]]
		if a.Queue != b.Queue {
			return a.Queue < b.Queue
		}
		return keys[i] < keys[j]
	})
	fmt.Fprintf(w, "%-16s %-40s %s\n", "QUEUE", "WORKLOAD", "OUTCOME")
	for _, k := range keys {
		o := r.Outcomes[k]
		fmt.Fprintf(w, "%-16s %-40s %s\n", orNone(o.Queue), k, short(&o))
		if o.What != Start && o.Message != "" {
			fmt.Fprintf(w, "%-16s %-40s   %s\n", "", "", o.Message)
		}
	}
}
