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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/queue"
)

// Paths the handlers are served at (kubebuilder's convention; the Helm
// chart's webhook configurations name them).
const (
	PodsPath   = "/mutate--v1-pod"
	QueuesPath = "/validate-tessera-dev-v1alpha1-queue"
)

// PodGater adds the admission scheduling gate to pods created with the
// queue label. Pods without the label are not touched.
type PodGater struct {
	Decoder admission.Decoder
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
	q, ok := pod.Labels[v1alpha1.QueueLabel]
	if !ok {
		return admission.Allowed("no queue label")
	}
	for _, gate := range pod.Spec.SchedulingGates {
		if gate.Name == v1alpha1.AdmissionGate {
			return admission.Allowed("already gated")
		}
	}
	if pod.Spec.NodeName != "" {
		// A pod bound at creation cannot be gated; the controller charges it.
		return admission.Allowed("bound at creation: not gated").WithWarnings(fmt.Sprintf("pod names node %s: it bypasses queue %s's admission (it is still charged)", pod.Spec.NodeName, q))
	}
	orig, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: v1alpha1.AdmissionGate})
	mutated, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	klog.FromContext(ctx).V(4).Info("Gating pod", "pod", klog.KRef(req.Namespace, podName(pod, req)), "queue", q)
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
	return admission.Allowed("")
}

// NewDecoder returns a decoder for the handlers.
func NewDecoder(scheme *runtime.Scheme) admission.Decoder { return admission.NewDecoder(scheme) }
