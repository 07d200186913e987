package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
)

// Pins. An admitted pod is pinned with required node affinity
// matchFields metadata.name In [node], added in the same patch that
// removes the admission gate: kube-scheduler's NodeAffinity plugin narrows
// the nodes it filters in PreFilter only for matchFields on metadata.name
// (k8s.io/kubernetes v1.37, nodeaffinity.PreFilter), so the DRA plugin
// then runs the allocator on one node instead of every feasible one; a
// kubernetes.io/hostname node selector narrows nothing.
//
// The API lets a gated pod's required node affinity only narrow (pkg/apis/
// core/validation validateNodeAffinityMutation: the number of terms stays,
// each term may only gain requirements at its end; with no terms, anything
// may be set), so the pin appends the requirement to every term (terms are
// ORed: each must name the node) or sets one term when there is none.
// Once the gate is off, affinity is immutable: a stale pin cannot be
// undone, only the pod replaced (see stalePins).

const (
	// PinnedAnnotation names the node the controller pinned the pod to
	// (written with the pin, in the patch that removes the gate).
	PinnedAnnotation = "tessera.dev/pinned-node"
	// ReasonStalePin is the admission condition's reason, and the
	// event's, on a pinned pod the controller deletes because its pin
	// went stale.
	ReasonStalePin = "StalePin"
	// nodeNameField is the node field matchFields supports.
	nodeNameField = "metadata.name"
)

// pinRequirement is the requirement a pin adds.
func pinRequirement(node string) corev1.NodeSelectorRequirement {
	return corev1.NodeSelectorRequirement{Key: nodeNameField, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}
}

// pinTerms returns the pod's required node selector terms narrowed to
// node, and false when the pod cannot or need not be pinned: a term that
// is empty (it matches no node, and the API refuses additions to it), or
// every term pinned to node already.
func pinTerms(p *corev1.Pod, node string) ([]corev1.NodeSelectorTerm, bool) {
	req := pinRequirement(node)
	var old []corev1.NodeSelectorTerm
	if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		old = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	}
	if len(old) == 0 {
		return []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{req}}}, true
	}
	terms := make([]corev1.NodeSelectorTerm, len(old))
	pinned := 0
	for i, t := range old {
		if len(t.MatchExpressions) == 0 && len(t.MatchFields) == 0 {
			return nil, false
		}
		if n := len(t.MatchFields); n > 0 && apiequality.Semantic.DeepEqual(t.MatchFields[n-1], req) {
			pinned++
		}
		terms[i] = *t.DeepCopy()
		terms[i].MatchFields = append(terms[i].MatchFields, req)
	}
	if pinned == len(old) {
		return nil, false
	}
	return terms, true
}

// pinPatch is the spec part of the ungating patch that pins the pod
// (nodeSelectorTerms is an atomic list: the patch carries all of it).
func pinPatch(terms []corev1.NodeSelectorTerm) map[string]any {
	return map[string]any{"nodeAffinity": map[string]any{
		"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": terms},
	}}
}

// Why a pin is stale.
const (
	StaleNodeGone      = "node-gone"
	StaleUnschedulable = "unschedulable"
)

// stalePin is a pinned pod to replace.
type stalePin struct {
	pod     *corev1.Pod
	reason  string // StaleNodeGone, StaleUnschedulable
	message string
}

// stalePins finds the pods the controller pinned that are not bound and
// either pinned to a node that no longer exists, or reported Unschedulable
// by the scheduler (PodScheduled=False, reason Unschedulable) for longer
// than grace. It also returns when the next pod that is unschedulable now
// would pass its grace (zero when none), so that the caller comes back
// then without a cycle in between.
func stalePins(pods []*corev1.Pod, nodes map[string]bool, grace time.Duration, now time.Time) ([]stalePin, time.Time) {
	var out []stalePin
	var next time.Time
	for _, p := range pods {
		node := p.Annotations[PinnedAnnotation]
		if node == "" || p.Spec.NodeName != "" || p.DeletionTimestamp != nil || decide.HasAdmissionGate(p) ||
			p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if !nodes[node] {
			out = append(out, stalePin{p, StaleNodeGone, fmt.Sprintf("pinned to node %s, which no longer exists", node)})
			continue
		}
		c := scheduledCondition(p)
		if c == nil || c.Status != corev1.ConditionFalse || c.Reason != corev1.PodReasonUnschedulable {
			continue
		}
		since := c.LastTransitionTime.Time
		if deadline := since.Add(grace); now.Before(deadline) {
			if next.IsZero() || deadline.Before(next) {
				next = deadline
			}
			continue
		}
		out = append(out, stalePin{p, StaleUnschedulable, fmt.Sprintf("pinned to node %s, where the scheduler has found no room for %s (%s)",
			node, now.Sub(since).Round(time.Second), c.Message)})
	}
	return out, next
}

func scheduledCondition(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodScheduled {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// controllerOf names the pod's managing owner ("ReplicaSet/web-7c9"), or
// "" for a bare pod.
func controllerOf(p *corev1.Pod) string {
	if ref := metav1.GetControllerOf(p); ref != nil {
		return ref.Kind + "/" + ref.Name
	}
	return ""
}

// staleMessage says what happens to a pod whose pin is stale.
func staleMessage(s stalePin) string {
	if owner := controllerOf(s.pod); owner != "" {
		return fmt.Sprintf("Stale pin: %s; deleting the pod, which was never bound, so that its owner %s recreates it and the replacement is queued and admitted again", s.message, owner)
	}
	return fmt.Sprintf("Stale pin: %s; deleting the pod, which was never bound: it has no owner to recreate it and its node affinity cannot change once ungated, so create it again to queue it again", s.message)
}

// recoverStalePins replaces the pods whose pins went stale (stalePins):
// each gets the admission condition False with reason StalePin and the
// DisruptionTarget condition (a Job's podFailurePolicy can ignore it), a
// Warning event, and is deleted (it was never bound: nothing ran), so that
// its owner recreates it and the replacement goes through the queue
// again; a bare pod is deleted too, its event and condition saying to
// create it again. With --replace-stale-pins=false the pod only gets the
// condition and event, and waits with that reason. It returns when the
// next pin would pass its grace.
func (a *Reconciler) recoverStalePins(ctx context.Context, pods *corev1.PodList) (time.Time, error) {
	var pinned []*corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Annotations[PinnedAnnotation] != "" && p.Spec.NodeName == "" && p.DeletionTimestamp == nil {
			pinned = append(pinned, p)
		}
	}
	if len(pinned) == 0 {
		return time.Time{}, nil
	}
	var nodes corev1.NodeList
	if err := a.Reader.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return time.Time{}, fmt.Errorf("listing nodes: %w", err)
	}
	names := make(map[string]bool, len(nodes.Items))
	for i := range nodes.Items {
		names[nodes.Items[i].Name] = true
	}
	stale, next := stalePins(pinned, names, a.Opts.StalePinGrace, time.Now())
	logger := klog.FromContext(ctx)
	now := metav1.Now()
	a.parallel(ctx, len(stale), func(i int) {
		s := stale[i]
		p := s.pod
		a.mu.Lock()
		_, done := a.evicted[p.UID]
		a.mu.Unlock()
		if done {
			return
		}
		if !a.Opts.ReplaceStalePins {
			msg := fmt.Sprintf("Stale pin: %s; not replaced (--replace-stale-pins=false): delete the pod to queue it again", s.message)
			if c := decide.AdmissionCondition(p); c != nil && c.Reason == ReasonStalePin && c.Message == msg {
				return
			}
			a.setCondition(ctx, p, corev1.ConditionFalse, ReasonStalePin, msg, now)
			a.Recorder.Eventf(p, nil, corev1.EventTypeWarning, ReasonStalePin, "Unpin", msg)
			return
		}
		msg := staleMessage(s)
		logger.Info("Replacing a pod whose pin went stale", "pod", klog.KObj(p), "reason", s.reason, "owner", controllerOf(p), "message", s.message)
		a.setConditions(ctx, p, now,
			corev1.PodCondition{Type: v1alpha1.AdmissionCondition, Status: corev1.ConditionFalse, Reason: ReasonStalePin, Message: msg},
			corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "TesseraStalePin", Message: msg})
		a.Recorder.Eventf(p, nil, corev1.EventTypeWarning, ReasonStalePin, "Evict", msg)
		// Through the Eviction API, as reclaim evicts: the controller needs
		// no delete verb on pods, and a pod that never ran is not protected
		// by a PodDisruptionBudget (it is not healthy), so it goes at once.
		if err := evictPod(ctx, a.Client, p, nil, false); err != nil {
			if !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				logger.Error(err, "Evicting a pod whose pin went stale failed; retrying", "pod", klog.KObj(p))
			}
			return
		}
		a.remember(&a.evicted, p.UID, nil)
		a.Metrics.stalePin(s.reason)
	})
	return next, nil
}
