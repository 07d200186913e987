// Package webhook serves Tessera's admission webhooks from the controller:
// a mutating webhook that gates pods labelled with a queue, and a
// validating webhook for Queues (parent cycles, unknown parents, quota above
// limit, deleting a queue that still has children). It also makes the
// serving certificate (a self-signed CA kept in a Secret, shared by all
// replicas) and keeps the webhook configurations pointing at the server
// with that CA, by URL (a controller running as a host process next to the
// API server) or by Service.
package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/queue"
)

// Paths the handlers are served at (kubebuilder's convention; the Helm
// chart's webhook configurations name them).
const (
	PodsPath   = "/mutate--v1-pod"
	QueuesPath = "/validate-tessera-dev-v1alpha1-queue"
)

// PodGater puts pods into their queue at creation: a pod that names a
// queue with the queue label, or that gets devices through DRA (a
// ResourceClaim, or an extended resource a DeviceClass serves) in a
// namespace labelled with a queue (a managed namespace), gets the queue
// label (the namespace's when it names none) and the admission scheduling
// gate. A pod naming a queue whose namespaceSelector does not match its
// namespace is refused (the controller checks again when it admits). Other
// pods are not touched.
type PodGater struct {
	Decoder admission.Decoder
	// Reader reads the pod's Namespace and Queue; nil skips the
	// namespace's queue and the selector check (unit tests of gating).
	// When it is a ReadThrough (CacheFirst is), a namespace its cache
	// holds as unmanaged is read again from the API server before a claim
	// user without a queue label is let through ungated.
	Reader client.Reader
}

// Handle implements admission.Handler.
func (g *PodGater) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	pod := &corev1.Pod{}
	if err := g.Decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	ns := pod.Namespace
	if ns == "" {
		ns = req.Namespace
	}
	var nsLabels map[string]string
	q, labelled := pod.Labels[v1alpha1.QueueLabel]
	devices := len(pod.Spec.ResourceClaims) > 0
	if g.Reader != nil {
		var namespace corev1.Namespace
		if err := g.Reader.Get(ctx, client.ObjectKey{Name: ns}, &namespace); err != nil {
			return admission.Errored(http.StatusInternalServerError, fmt.Errorf("reading namespace %s: %w", ns, err))
		}
		nsLabels = namespace.Labels
		if !labelled && !devices {
			// Devices come through extended resources too, which only the
			// live DeviceClasses tell apart from a device plugin's.
			ext, err := extendedResources(ctx, g.Reader)
			if err != nil {
				return admission.Errored(http.StatusInternalServerError, err)
			}
			devices, _ = usesDevices(pod, ext)
		}
		if _, managed := nsLabels[v1alpha1.QueueLabel]; !managed && !labelled && devices {
			// The cache says unmanaged, which lets this device user run
			// outside any queue: a namespace labelled a moment ago may not
			// be in the cache yet, and a stale cache may not decide in the
			// tenant's favour. Ask the API server.
			if rt, ok := g.Reader.(ReadThrough); ok {
				if err := rt.ReadThrough().Get(ctx, client.ObjectKey{Name: ns}, &namespace); err != nil {
					return admission.Errored(http.StatusInternalServerError, fmt.Errorf("reading namespace %s from the API server: %w", ns, err))
				}
				nsLabels = namespace.Labels
			}
		}
	} else {
		devices, _ = usesDevices(pod, nil)
	}
	stamp := false
	if !labelled {
		nsQueue, managed := nsLabels[v1alpha1.QueueLabel]
		if !managed || !devices {
			return admission.Allowed("no queue label")
		}
		// A managed namespace: its pods that get devices through DRA go
		// through its queue.
		q, stamp = nsQueue, true
	}
	if g.Reader != nil && q != "" {
		var qobj v1alpha1.Queue
		err := g.Reader.Get(ctx, client.ObjectKey{Name: q}, &qobj)
		switch {
		case apierrors.IsNotFound(err):
			// The controller says so in the pod's condition until it exists.
		case err != nil:
			return admission.Errored(http.StatusInternalServerError, fmt.Errorf("reading queue %s: %w", q, err))
		default:
			if msg := queue.FromAPI(&qobj).RefusesNamespace(ns, nsLabels); msg != "" {
				return admission.Denied(msg)
			}
		}
	}
	gated := false
	for _, gate := range pod.Spec.SchedulingGates {
		if gate.Name == v1alpha1.AdmissionGate {
			gated = true
		}
	}
	if gated && !stamp {
		return admission.Allowed("already gated")
	}
	if pod.Spec.NodeName != "" {
		if stamp {
			return admission.Denied(fmt.Sprintf("namespace %s is managed by queue %s (label %s): a pod that gets devices through DRA (a ResourceClaim or an extended resource a DeviceClass serves) goes through the queue and cannot name a node at creation (spec.nodeName %s); leave spec.nodeName out", ns, q, v1alpha1.QueueLabel, pod.Spec.NodeName))
		}
		// A pod bound at creation cannot be gated; the controller charges it.
		return admission.Allowed("bound at creation: not gated").WithWarnings(fmt.Sprintf("pod names node %s: it bypasses queue %s's admission (it is still charged)", pod.Spec.NodeName, q))
	}
	orig, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if stamp {
		if pod.Labels == nil {
			pod.Labels = map[string]string{}
		}
		pod.Labels[v1alpha1.QueueLabel] = q
	}
	if !gated {
		pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: v1alpha1.AdmissionGate})
	}
	mutated, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	klog.FromContext(ctx).V(4).Info("Gating pod", "pod", klog.KRef(ns, podName(pod, req)), "queue", q, "fromNamespace", stamp)
	return admission.PatchResponseFromRaw(orig, mutated)
}

func podName(p *corev1.Pod, req admission.Request) string {
	if p.Name != "" {
		return p.Name
	}
	if req.Name != "" {
		return req.Name
	}
	return p.GenerateName + "*"
}

// QueueValidator checks Queues against the other queues.
type QueueValidator struct {
	Decoder admission.Decoder
	// Reader lists the existing queues; an uncached reader sees the
	// newest state, a cached one may lag behind by a moment.
	Reader client.Reader
}

// Handle implements admission.Handler.
func (v *QueueValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	var list v1alpha1.QueueList
	if err := v.Reader.List(ctx, &list); err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("listing queues: %w", err))
	}
	var others []*v1alpha1.Queue
	for i := range list.Items {
		if list.Items[i].Name != req.Name {
			others = append(others, &list.Items[i])
		}
	}
	if req.Operation == admissionv1.Delete {
		var all []*v1alpha1.Queue
		for i := range list.Items {
			all = append(all, &list.Items[i])
		}
		if kids := queue.Children(req.Name, all); len(kids) > 0 {
			sort.Strings(kids)
			return admission.Denied(fmt.Sprintf("queue %s is the parent of %s: delete or re-parent them first", req.Name, strings.Join(kids, ", ")))
		}
		return admission.Allowed("")
	}
	q := &v1alpha1.Queue{}
	if err := v.Decoder.DecodeRaw(req.Object, q); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if errs := queue.Validate(q, others); len(errs) > 0 {
		return admission.Denied(fmt.Sprintf("queue %s: %s", q.Name, strings.Join(errs, "; ")))
	}
	// A child naming another controller than its root's is kept (the
	// root may move next) but not followed: say so now, as its condition
	// ControllerAssigned will.
	if o := queue.Owners(append(others, q))[q.Name]; o.Refused != "" {
		return admission.Allowed("").WithWarnings(fmt.Sprintf("queue %s: %s", q.Name, o.Refused))
	}
	return admission.Allowed("")
}

// NewDecoder returns a decoder for the handlers.
func NewDecoder(scheme *runtime.Scheme) admission.Decoder { return admission.NewDecoder(scheme) }
