package decide

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/podclaims"
	"github.com/tessera-dev/tessera/pkg/control/queue"
)

// Workload is what is admitted as one: a pod, or the members of a gang.
// The admitted members and the gated members of a gang are two workloads:
// members that join a running gang are admitted on their own (all of them
// together), the running part is what reclaim may evict.
type Workload struct {
	// Key is "<namespace>/<gang or pod name>", with "+" appended for the
	// gated members that join an admitted gang.
	Key       string
	Namespace string
	// Name is the gang or pod name.
	Name string
	Gang bool
	// Size is the number of members a gang needs before it is admitted.
	Size int
	// QueueName is the value of the queue label.
	QueueName string
	// Pods are the members this workload is about (gated or admitted).
	Pods     []*corev1.Pod
	Admitted bool
	// Created is the earliest member's creation time (FIFO order).
	Created time.Time
	// AdmittedAt is when the workload was admitted (from the pods'
	// admission condition, else their creation).
	AdmittedAt time.Time
	// Priority is the highest pod priority among the members.
	Priority int32
	// Terminating is set when a member of an admitted workload is being
	// deleted.
	Terminating bool
	// Charge is what the workload is charged (admitted) or was charged at
	// admission in this cycle.
	Charge queue.Vector

	leaf     *queue.Queue
	problem  string // bad input: never admitted as is
	wait     string // waits for something that is not there yet
	waitWhy  string
	claims   map[*corev1.Pod][]podclaims.PodClaim
	holdings []holding
	// adopted marks the unqueued pods of a managed namespace (charges.go).
	adopted bool
}

// Describe names the workload in messages: "gang train-1" or "pod p".
func (w *Workload) Describe() string {
	if w.Gang {
		return "gang " + w.Name
	}
	return "pod " + w.Name
}

// DescribeTo names the workload in a message that a user of namespace
// reader may read (a pod condition, an event): by name in its own
// namespace, as "a workload of another namespace" elsewhere, so that no
// tenant learns another's pod or gang names.
func (w *Workload) DescribeTo(reader string) string {
	if w.Namespace == reader {
		return w.Describe()
	}
	return "a workload of another namespace"
}

// Leaf is the workload's queue, nil when it has none.
func (w *Workload) Leaf() *queue.Queue { return w.leaf }

// AdmissionCondition is the pod's admission condition (nil: none
// written yet).
func AdmissionCondition(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == v1alpha1.AdmissionCondition {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// HasAdmissionGate says whether the pod still waits for admission.
func HasAdmissionGate(p *corev1.Pod) bool {
	for _, g := range p.Spec.SchedulingGates {
		if g.Name == v1alpha1.AdmissionGate {
			return true
		}
	}
	return false
}

func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// admittedAt reads the admission time from the pod's annotation or
// condition, else its creation.
func admittedAt(p *corev1.Pod) time.Time {
	if v := p.Annotations[v1alpha1.AdmittedAtAnnotation]; v != "" {
		if t, err := time.Parse(time.RFC3339, v); err == nil {
			return t
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1alpha1.AdmissionCondition && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime.Time
		}
	}
	return p.CreationTimestamp.Time
}

// groupWorkloads turns labelled pods into workloads and checks the labels.
// Terminal pods are left out: what they held is released.
func groupWorkloads(pods []*corev1.Pod, tree *queue.Tree) []*Workload {
	type group struct {
		key, ns, name string
		gang          bool
		pods          []*corev1.Pod
	}
	groups := map[string]*group{}
	var order []string
	for _, p := range pods {
		if terminal(p) {
			continue
		}
		if _, ok := p.Labels[v1alpha1.QueueLabel]; !ok {
			continue
		}
		gang, isGang := p.Labels[v1alpha1.GangLabel]
		name := p.Name
		key := p.Namespace + "/pod/" + p.Name
		if isGang {
			name = gang
			key = p.Namespace + "/gang/" + gang
		}
		g := groups[key]
		if g == nil {
			g = &group{key: key, ns: p.Namespace, name: name, gang: isGang}
			groups[key] = g
			order = append(order, key)
		}
		g.pods = append(g.pods, p)
	}
	sort.Strings(order)
	var out []*Workload
	for _, key := range order {
		g := groups[key]
		sort.Slice(g.pods, func(i, j int) bool { return g.pods[i].Name < g.pods[j].Name })
		var admitted, gated []*corev1.Pod
		for _, p := range g.pods {
			if HasAdmissionGate(p) {
				if p.DeletionTimestamp == nil {
					gated = append(gated, p)
				}
			} else {
				admitted = append(admitted, p)
			}
		}
		base := Workload{Namespace: g.ns, Name: g.name, Gang: g.gang}
		validate(&base, g.pods, tree)
		// Admitted members stay charged to the queue that admitted them
		// whatever the gated ones say (a new member naming another queue
		// makes the gang invalid, not its running part free): they are
		// grouped by their own queue labels.
		for i, part := range byQueue(admitted) {
			w := Workload{Namespace: g.ns, Name: g.name, Gang: g.gang}
			validate(&w, part, tree)
			w.Key = g.ns + "/" + g.name
			if i > 0 {
				w.Key += "@" + part[0].Labels[v1alpha1.QueueLabel]
			}
			w.Pods = part
			w.Admitted = true
			w.problem, w.wait = "", ""
			fill(&w)
			out = append(out, &w)
		}
		if len(gated) > 0 {
			w := base
			w.Key = g.ns + "/" + g.name
			w.Pods = gated
			fill(&w)
			if len(admitted) > 0 {
				// Members joining an admitted gang go in together, with no
				// minimum to wait for.
				w.Key += "+"
				w.Size = len(gated)
			} else if w.problem == "" && w.Gang && len(gated) < w.Size {
				w.wait = fmt.Sprintf("gang %s: %d of %d members exist", w.Name, len(gated), w.Size)
				w.waitWhy = ReasonGangIncomplete
			}
			if w.problem == "" && w.wait == "" {
				// Tessera's gate comes off last: a pod that another gate
				// holds is not admitted (nor holds devices) until it is
				// free to schedule.
				for _, p := range gated {
					if others := otherGates(p); len(others) > 0 {
						w.wait = fmt.Sprintf("pod %s: waiting for its other scheduling gates to be removed (%s); it is admitted after them", p.Name, strings.Join(others, ", "))
						w.waitWhy = ReasonWaitingForGates
						break
					}
				}
			}
			out = append(out, &w)
		}
	}
	return out
}

// byQueue splits pods by their queue label, in the order of first
// appearance; nil for none.
func byQueue(pods []*corev1.Pod) [][]*corev1.Pod {
	var out [][]*corev1.Pod
	idx := map[string]int{}
	for _, p := range pods {
		q := p.Labels[v1alpha1.QueueLabel]
		i, ok := idx[q]
		if !ok {
			i = len(out)
			idx[q] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], p)
	}
	return out
}

func fill(w *Workload) {
	w.Created = w.Pods[0].CreationTimestamp.Time
	w.AdmittedAt = time.Time{}
	for _, p := range w.Pods {
		if p.CreationTimestamp.Time.Before(w.Created) {
			w.Created = p.CreationTimestamp.Time
		}
		w.Priority = max(w.Priority, ptr.Deref(p.Spec.Priority, 0))
		if w.Admitted {
			if t := admittedAt(p); t.After(w.AdmittedAt) {
				w.AdmittedAt = t
			}
			if p.DeletionTimestamp != nil {
				w.Terminating = true
			}
		}
	}
}

// validate checks queue and gang labels of a group: bad input is recorded
// in w.problem with a message that names the problem and the fix.
func validate(w *Workload, pods []*corev1.Pod, tree *queue.Tree) {
	queues := map[string]bool{}
	sizes := map[string]bool{}
	for _, p := range pods {
		queues[p.Labels[v1alpha1.QueueLabel]] = true
		if w.Gang {
			sizes[p.Labels[v1alpha1.GangSizeLabel]] = true
		}
	}
	if len(queues) > 1 {
		w.problem = fmt.Sprintf("gang %s: members name different queues (%s); all members of a gang must use one queue", w.Name, strings.Join(sortedSet(queues), ", "))
		return
	}
	for name := range queues {
		w.QueueName = name
	}
	switch q := tree.Queues[w.QueueName]; {
	case w.QueueName == "":
		w.problem = fmt.Sprintf("label %s is empty: name a leaf queue", v1alpha1.QueueLabel)
		return
	case q == nil:
		w.problem = fmt.Sprintf("queue %s does not exist: create it or fix label %s", w.QueueName, v1alpha1.QueueLabel)
		return
	case q.Invalid != "":
		w.problem = fmt.Sprintf("queue %s cannot take workloads: %s", w.QueueName, q.Invalid)
		w.leaf = q
		return
	case !q.IsLeaf():
		var kids []string
		for _, c := range q.Children {
			kids = append(kids, c.Name)
		}
		w.problem = fmt.Sprintf("queue %s is not a leaf queue (it has children %s): use one of them", w.QueueName, strings.Join(kids, ", "))
		w.leaf = q
		return
	default:
		w.leaf = q
	}
	if !w.Gang {
		return
	}
	if w.Name == "" {
		w.problem = fmt.Sprintf("label %s is empty: name the gang", v1alpha1.GangLabel)
		return
	}
	if len(sizes) > 1 {
		w.problem = fmt.Sprintf("gang %s: members disagree on label %s (%s)", w.Name, v1alpha1.GangSizeLabel, strings.Join(sortedSet(sizes), ", "))
		return
	}
	for s := range sizes {
		if s == "" {
			w.problem = fmt.Sprintf("gang %s: label %s is missing: set it to the number of members that must start together", w.Name, v1alpha1.GangSizeLabel)
			return
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			w.problem = fmt.Sprintf("gang %s: label %s=%q is not a positive number", w.Name, v1alpha1.GangSizeLabel, s)
			return
		}
		w.Size = n
	}
}

func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		if k == "" {
			k = `""`
		}
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
