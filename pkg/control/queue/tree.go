package queue

import (
	"fmt"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// Queue is one node of the hierarchy with its bounds and, once the
// admission loop filled them in, its usage and fair share. Usage of a node
// includes its descendants'.
type Queue struct {
	Name     string
	Parent   *Queue
	Children []*Queue
	Priority int32
	Quota    Vector
	// Limit per resource; NoLimit where unset.
	Limit  Vector
	Weight Vector
	// Bounded marks the resources the queue lists in spec.resources; quota
	// decisions look only at these. A leaf queue that lists none is bounded
	// in all of them with quota 0; a parent queue that lists none only
	// groups its children (see NewTree).
	Bounded [NumResources]bool
	listed  bool
	// Invalid says why the queue cannot take workloads (unknown parent,
	// cycle); empty when it can.
	Invalid string
	// namespaces is spec.namespaceSelector (nil: every namespace);
	// badSelector says why it does not parse.
	namespaces  labels.Selector
	badSelector string

	// Allocated is held by admitted workloads of the subtree.
	Allocated Vector
	// Pending is the demand of the subtree's waiting workloads.
	Pending Vector
	// FairShare is computed by Tree.ComputeFairShare.
	FairShare Vector

	// UsageFactor turns on time-based fair share among the queue's
	// children (spec.fairSharing.usageWeighting): 0 is off.
	UsageFactor float64
	// DecayedUsage is the subtree's decayed allocated usage per resource
	// (status.usage.decayed: GiB-hours, GPU-hours).
	DecayedUsage [NumResources]float64
}

// RefusesNamespace says why the queue does not take pods of namespace ns
// whose labels are nsLabels (spec.namespaceSelector, as Kueue's
// ClusterQueue; unset takes every namespace), or "" when it takes them.
// The webhook asks at a pod's creation and the controller again at every
// decision, so that a selector narrowed later, or a queue created after the
// pod that named it, holds too.
func (q *Queue) RefusesNamespace(ns string, nsLabels map[string]string) string {
	switch {
	case q.badSelector != "":
		return fmt.Sprintf("queue %s has an invalid spec.namespaceSelector (%s): ask the cluster administrator to fix it", q.Name, q.badSelector)
	case q.namespaces == nil || q.namespaces.Matches(labels.Set(nsLabels)):
		return ""
	}
	return fmt.Sprintf("queue %s takes pods only from namespaces matching its namespaceSelector %q; namespace %s does not match: use a queue meant for this namespace", q.Name, q.namespaces.String(), ns)
}

// IsLeaf says whether the queue can take workloads directly.
func (q *Queue) IsLeaf() bool { return len(q.Children) == 0 }

// Path returns the queue and its ancestors, the queue first.
func (q *Queue) Path() []*Queue {
	var out []*Queue
	for n := q; n != nil; n = n.Parent {
		out = append(out, n)
	}
	return out
}

// Tree is the queue hierarchy.
type Tree struct {
	Queues map[string]*Queue
	// Roots are the top-level queues (and queues cut off by a problem), by name.
	Roots []*Queue
}

// FromAPI converts a Queue object's spec.
func FromAPI(obj *v1alpha1.Queue) *Queue {
	q := &Queue{
		Name:     obj.Name,
		Priority: obj.Spec.Priority,
		Limit:    Vector{NoLimit, NoLimit},
		Weight:   Vector{1, 1},
	}
	for r := range NumResources {
		res, ok := obj.Spec.Resources[Names[r]]
		if !ok {
			continue
		}
		q.Bounded[r] = true
		if res.Quota != nil {
			q.Quota[r] = max(0, FromQuantity(r, *res.Quota))
		}
		if res.Limit != nil {
			q.Limit[r] = max(0, FromQuantity(r, *res.Limit))
		}
		if res.OverQuotaWeight != nil {
			q.Weight[r] = int64(max(0, *res.OverQuotaWeight))
		}
	}
	if fs := obj.Spec.FairSharing; fs != nil && fs.UsageWeighting != nil && fs.UsageWeighting.Enabled {
		q.UsageFactor = 1
		if f := fs.UsageWeighting.Factor; f != nil {
			q.UsageFactor = min(max(f.AsApproximateFloat64(), 0), 100)
		}
	}
	if u := obj.Status.Usage; u != nil {
		q.DecayedUsage[Memory] = parseDecimal(u.Decayed.AllocatedMemoryGiBHours)
		q.DecayedUsage[GPUs] = parseDecimal(u.Decayed.AllocatedGPUHours)
	}
	if sel := obj.Spec.NamespaceSelector; sel != nil {
		var err error
		if q.namespaces, err = metav1.LabelSelectorAsSelector(sel); err != nil {
			q.badSelector = err.Error()
		}
	}
	q.listed = q.Bounded != [NumResources]bool{}
	if !q.listed {
		q.Bounded = [NumResources]bool{true, true}
	}
	return q
}

// NewTree links queues into a hierarchy. A queue whose parent is unknown or
// which sits on a parent cycle is kept as a root and marked Invalid, and so
// is everything below it: its workloads are refused with that reason,
// nothing else is held up.
func NewTree(objs []*v1alpha1.Queue) *Tree {
	t := &Tree{Queues: make(map[string]*Queue, len(objs))}
	parents := make(map[string]string, len(objs))
	for _, o := range objs {
		t.Queues[o.Name] = FromAPI(o)
		parents[o.Name] = o.Spec.Parent
	}
	for _, name := range sortedKeys(t.Queues) {
		q := t.Queues[name]
		p := parents[name]
		switch {
		case p == "":
		case onCycle(name, parents):
			q.Invalid = fmt.Sprintf("queue %s is on a parent cycle (%s)", name, cycleString(name, parents))
		case t.Queues[p] == nil:
			q.Invalid = fmt.Sprintf("queue %s names parent %q, which does not exist", name, p)
		default:
			q.Parent = t.Queues[p]
			q.Parent.Children = append(q.Parent.Children, q)
		}
		if q.Parent == nil {
			t.Roots = append(t.Roots, q)
		}
	}
	// Propagate problems down.
	var mark func(q *Queue, why string)
	mark = func(q *Queue, why string) {
		for _, c := range q.Children {
			if c.Invalid == "" {
				c.Invalid = why
			}
			mark(c, why)
		}
	}
	for _, r := range t.Roots {
		if r.Invalid != "" {
			mark(r, r.Invalid)
		}
		group(r)
	}
	return t
}

// group makes parent queues that list no resources transparent: no quota
// check of their own, and the sum of their children's quotas as their
// quota when the fair share is divided among siblings.
func group(q *Queue) Vector {
	if q.IsLeaf() {
		return q.Quota
	}
	var sum Vector
	for _, c := range q.Children {
		sum = sum.Add(group(c))
	}
	if !q.listed {
		q.Bounded = [NumResources]bool{}
		q.Quota = sum
	}
	return q.Quota
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// onCycle says whether following parents from name comes back to name.
func onCycle(name string, parents map[string]string) bool {
	seen := map[string]bool{}
	for n := parents[name]; n != ""; n = parents[n] {
		if n == name {
			return true
		}
		if seen[n] {
			return false // a cycle above, not through name
		}
		seen[n] = true
	}
	return false
}

func cycleString(name string, parents map[string]string) string {
	chain := []string{name}
	for n := parents[name]; n != "" && n != name && len(chain) < 32; n = parents[n] {
		chain = append(chain, n)
	}
	return strings.Join(append(chain, name), " -> ")
}

// ResetUsage clears Allocated and Pending everywhere.
func (t *Tree) ResetUsage() {
	for _, q := range t.Queues {
		q.Allocated, q.Pending = Vector{}, Vector{}
	}
}

// Charge adds v to the allocation of q and its ancestors.
func Charge(q *Queue, v Vector) {
	for n := q; n != nil; n = n.Parent {
		n.Allocated = n.Allocated.Add(v)
	}
}

// Release subtracts v from the allocation of q and its ancestors.
func Release(q *Queue, v Vector) {
	for n := q; n != nil; n = n.Parent {
		n.Allocated = n.Allocated.Sub(v)
	}
}

// AddPending adds v to the pending demand of q and its ancestors.
func AddPending(q *Queue, v Vector) {
	for n := q; n != nil; n = n.Parent {
		n.Pending = n.Pending.Add(v)
	}
}

// Violation describes a bound a charge would break.
type Violation struct {
	Queue    *Queue
	Resource Resource
	Need     int64
	InUse    int64
	Quota    int64
	Limit    int64
	// OverLimit is true for a limit violation, false for a quota overrun.
	OverLimit bool
}

// Message renders the violation the way pods and events show it, e.g.
// "queue team-a: needs 8Gi gpu memory; quota 16Gi, in use 12Gi, limit 16Gi".
func (v *Violation) Message(leaf *Queue) string {
	name := "queue " + v.Queue.Name
	if leaf != nil && leaf != v.Queue {
		name = fmt.Sprintf("queue %s (ancestor of %s)", v.Queue.Name, leaf.Name)
	}
	limit := "no limit"
	if v.Limit != NoLimit {
		limit = "limit " + FormatAmount(v.Resource, v.Limit)
	}
	return fmt.Sprintf("%s: needs %s %s; quota %s, in use %s, %s",
		name, FormatAmount(v.Resource, v.Need), HumanName(v.Resource),
		FormatAmount(v.Resource, v.Quota), FormatAmount(v.Resource, v.InUse), limit)
}

// CheckLimits returns the first limit the charge breaks on q or an
// ancestor, or nil.
func CheckLimits(q *Queue, charge Vector) *Violation {
	for n := q; n != nil; n = n.Parent {
		for r := range NumResources {
			if charge[r] > 0 && n.Limit[r] != NoLimit && satAdd(n.Allocated[r], charge[r]) > n.Limit[r] {
				return &Violation{Queue: n, Resource: r, Need: charge[r], InUse: n.Allocated[r], Quota: n.Quota[r], Limit: n.Limit[r], OverLimit: true}
			}
		}
	}
	return nil
}

// CheckQuota returns the first quota the charge overruns on q or an
// ancestor, or nil when the charge stays within quota all the way up.
// Only the resources a queue bounds count.
func CheckQuota(q *Queue, charge Vector) *Violation {
	for n := q; n != nil; n = n.Parent {
		for r := range NumResources {
			if n.Bounded[r] && charge[r] > 0 && satAdd(n.Allocated[r], charge[r]) > n.Quota[r] {
				return &Violation{Queue: n, Resource: r, Need: charge[r], InUse: n.Allocated[r], Quota: n.Quota[r], Limit: n.Limit[r]}
			}
		}
	}
	return nil
}

// OverQuota says whether q holds more than its quota of some resource it
// bounds.
func (q *Queue) OverQuota() bool {
	for r := range NumResources {
		if q.Bounded[r] && q.Allocated[r] > q.Quota[r] {
			return true
		}
	}
	return false
}

// CanGive says whether releasing v keeps every queue from q up to (not
// including) stop at or above its quota in every resource v touches: the
// rule that reclaim never takes a queue below its quota.
func CanGive(q, stop *Queue, v Vector) bool {
	for n := q; n != nil && n != stop; n = n.Parent {
		for r := range NumResources {
			if n.Bounded[r] && v[r] > 0 && satSub(n.Allocated[r], v[r]) < n.Quota[r] {
				return false
			}
		}
	}
	return true
}

// CommonAncestor returns the lowest queue on both paths, or nil.
func CommonAncestor(a, b *Queue) *Queue {
	on := map[*Queue]bool{}
	for n := a; n != nil; n = n.Parent {
		on[n] = true
	}
	for n := b; n != nil; n = n.Parent {
		if on[n] {
			return n
		}
	}
	return nil
}
