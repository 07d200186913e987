package controller

import (
	"bytes"
	"context"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
)

// Triggers: why a cycle ran (the trigger label of MetricCyclesTotal).
const (
	TriggerPod       = "pod"       // a gated pod created or changed; a queued pod ended, was deleted or bound
	TriggerClaim     = "claim"     // a claim created, deleted, or its allocation changed
	TriggerQueue     = "queue"     // a Queue created, deleted, or its spec or labels changed
	TriggerSlice     = "slice"     // a ResourceSlice created, deleted or changed
	TriggerClass     = "class"     // a DeviceClass created, deleted or changed
	TriggerNode      = "node"      // a node created, deleted, or its labels, taints, cordon, readiness or allocatable changed
	TriggerNamespace = "namespace" // a namespace's labels changed (queues' namespaceSelectors match them)
	TriggerStalePin  = "stale-pin" // a pinned pod's PodScheduled condition changed
	TriggerResync    = "resync"    // --resync-period passed with pods gated
	TriggerRetry     = "retry"     // reasons left to write, or the last cycle failed
	// TriggerUsage marks a claim's usage sample (status.devices data)
	// changed: what the queues use moved, nothing that admits a pod; it
	// refreshes queue status when nothing is gated and runs no cycle.
	TriggerUsage = "usage"
)

// Why a cycle was skipped (the reason label of MetricCyclesSkippedTotal).
const (
	SkipNothingGated = "nothing-gated"
	SkipNoChange     = "no-change"
)

// changeTrigger says whether a change could admit a gated pod, change what
// the queues hold, or make a pin stale, and as which trigger; old is nil
// for a creation, new for a deletion. Everything else (node heartbeats,
// claim device status, the controller's own status writes, a running
// pod's status) runs no cycle.
func changeTrigger(old, new client.Object) (string, bool) {
	obj := new
	if obj == nil {
		obj = old
	}
	switch obj.(type) {
	case *corev1.Pod:
		if old == nil || new == nil {
			return TriggerPod, true
		}
		return podTrigger(old.(*corev1.Pod), new.(*corev1.Pod))
	case *resourceapi.ResourceClaim:
		if old == nil || new == nil {
			return TriggerClaim, true
		}
		o, n := old.(*resourceapi.ResourceClaim), new.(*resourceapi.ResourceClaim)
		changed := !apiequality.Semantic.DeepEqual(o.Status.Allocation, n.Status.Allocation) ||
			(len(o.Status.ReservedFor) == 0) != (len(n.Status.ReservedFor) == 0) ||
			(o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
		if !changed && usageChanged(o, n) {
			return TriggerUsage, true
		}
		return TriggerClaim, changed
	case *v1alpha1.Queue:
		return TriggerQueue, old == nil || new == nil || old.GetGeneration() != new.GetGeneration() ||
			!apiequality.Semantic.DeepEqual(old.GetLabels(), new.GetLabels())
	case *resourceapi.ResourceSlice:
		return TriggerSlice, old == nil || new == nil || old.GetGeneration() != new.GetGeneration()
	case *resourceapi.DeviceClass:
		return TriggerClass, old == nil || new == nil || old.GetGeneration() != new.GetGeneration()
	case *resourceapi.DeviceTaintRule:
		// Taints devices as a slice's own taints do.
		return TriggerSlice, old == nil || new == nil || old.GetGeneration() != new.GetGeneration()
	case *corev1.Node:
		if old == nil || new == nil {
			return TriggerNode, true
		}
		o, n := old.(*corev1.Node), new.(*corev1.Node)
		// Allocatable: an extended resource a device plugin serves there is
		// not served through DRA there (decide's placer).
		return TriggerNode, o.Spec.Unschedulable != n.Spec.Unschedulable || nodeReady(o) != nodeReady(n) ||
			!apiequality.Semantic.DeepEqual(o.Labels, n.Labels) || !apiequality.Semantic.DeepEqual(o.Spec.Taints, n.Spec.Taints) ||
			!apiequality.Semantic.DeepEqual(o.Status.Allocatable, n.Status.Allocatable)
	case *corev1.Namespace:
		if old == nil || new == nil {
			_, queued := obj.GetLabels()[v1alpha1.QueueLabel]
			return TriggerNamespace, queued
		}
		// Any label: a queue's namespaceSelector may match it.
		return TriggerNamespace, !apiequality.Semantic.DeepEqual(old.GetLabels(), new.GetLabels())
	}
	return "", true // unknown kinds: decide, to be safe
}

// usageChanged says whether the data of a claim's device statuses (where
// the kubelet plugin writes its usage samples) changed.
func usageChanged(o, n *resourceapi.ResourceClaim) bool {
	data := func(c *resourceapi.ResourceClaim) [][]byte {
		var out [][]byte
		for _, d := range c.Status.Devices {
			if d.Data != nil && len(d.Data.Raw) > 0 {
				out = append(out, d.Data.Raw)
			}
		}
		return out
	}
	od, nd := data(o), data(n)
	if len(od) != len(nd) {
		return true
	}
	for i := range od {
		if !bytes.Equal(od[i], nd[i]) {
			return true
		}
	}
	return false
}

func podTrigger(o, n *corev1.Pod) (string, bool) {
	if (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) || o.Spec.NodeName != n.Spec.NodeName ||
		terminal(o) != terminal(n) {
		return TriggerPod, true
	}
	if decide.HasAdmissionGate(n) {
		// Status alone (the controller's own condition) changes nothing.
		return TriggerPod, !apiequality.Semantic.DeepEqual(o.Spec, n.Spec) ||
			!apiequality.Semantic.DeepEqual(o.Labels, n.Labels) || !apiequality.Semantic.DeepEqual(o.Annotations, n.Annotations)
	}
	if n.Annotations[PinnedAnnotation] != "" && n.Spec.NodeName == "" {
		oc, nc := scheduledCondition(o), scheduledCondition(n)
		if (oc == nil) != (nc == nil) || (nc != nil && (oc.Status != nc.Status || oc.Reason != nc.Reason)) {
			return TriggerStalePin, true
		}
	}
	// The gate removed (the controller's own ungate, already in its
	// memo), or a running pod's status.
	return TriggerPod, false
}

func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Handler is the event handler of every watch: a relevant change is
// recorded as a trigger and enqueues the one key.
func (a *Reconciler) Handler() handler.EventHandler {
	mark := func(old, new client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		if trig, ok := changeTrigger(old, new); ok {
			a.Trigger(trig)
			q.Add(CycleRequest)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			mark(nil, e.Object, q)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			mark(e.ObjectOld, e.ObjectNew, q)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			mark(e.Object, nil, q)
		},
		GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			a.Trigger(TriggerResync)
			q.Add(CycleRequest)
		},
	}
}

// Trigger records a reason for the next cycle; TriggerUsage only marks
// queue status for a refresh.
func (a *Reconciler) Trigger(trigger string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if trigger == TriggerUsage {
		a.accounting = true
		return
	}
	if a.triggers == nil {
		a.triggers = map[string]bool{}
	}
	if len(a.triggers) == 0 {
		a.first = trigger
	}
	a.triggers[trigger] = true
}
