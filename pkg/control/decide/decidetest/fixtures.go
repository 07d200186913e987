// Package decidetest builds simulated clusters for the controller's
// tests and benchmarks: nodes whose ResourceSlices are published exactly as
// the kubelet plugin publishes them (nvmlmock -> discover -> devicemodel ->
// publish), the shipped DeviceClasses, and pods, templates and claims.
package decidetest

import (
	"context"
	"fmt"

	"github.com/tessera-dev/tessera/pkg/control/queue"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/deployments"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/nodeslices"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
)

// NodeOptions shape a simulated node.
type NodeOptions struct {
	// Profile is an nvmlmock profile, e.g. "h100-80gb:8" or "dgxh100".
	Profile    string
	TimeSlices int
	MIG        bool
}

// NodeSlices publishes a simulated node as the kubelet plugin would.
func NodeSlices(node string, o NodeOptions) ([]*resourceapi.ResourceSlice, error) {
	spec, err := nvmlmock.ParseProfile(o.Profile)
	if err != nil {
		return nil, err
	}
	cfg := devicemodel.DefaultConfig()
	cfg.TimeSlices = o.TimeSlices
	n, err := nodeslices.Mock(context.Background(), spec, o.MIG, cfg, node)
	if err != nil {
		return nil, err
	}
	return n.Slices, nil
}

// Node returns a ready, schedulable Node object.
func Node(name string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}
}

// Classes returns the shipped DeviceClasses.
func Classes() []*resourceapi.DeviceClass {
	c, err := deployments.DeviceClasses()
	if err != nil {
		panic(err)
	}
	return c
}

// Request describes one device request of a claim.
type Request struct {
	Class  string // default gpu.tessera.dev
	Memory string // capacity.requests.memory; "" = whole device
	Count  int64
	// Selector is an extra CEL selector.
	Selector string
}

// ClaimSpec builds a claim spec with the given requests.
func ClaimSpec(reqs ...Request) resourceapi.ResourceClaimSpec {
	var spec resourceapi.ResourceClaimSpec
	for i, r := range reqs {
		class := r.Class
		if class == "" {
			class = devicemodel.DriverName
		}
		ex := &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: max(r.Count, 1)}
		if r.Memory != "" {
			ex.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{devicemodel.CapMemory: resource.MustParse(r.Memory)}}
		}
		if r.Selector != "" {
			ex.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: r.Selector}}}
		}
		spec.Devices.Requests = append(spec.Devices.Requests, resourceapi.DeviceRequest{Name: fmt.Sprintf("r%d", i), Exactly: ex})
	}
	return spec
}

// Template returns a ResourceClaimTemplate.
func Template(ns, name string, reqs ...Request) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: ClaimSpec(reqs...)},
	}
}

// Claim returns a ResourceClaim.
func Claim(ns, name string, reqs ...Request) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-claim-" + ns + "-" + name)},
		Spec:       ClaimSpec(reqs...),
	}
}

// PodOptions shape a pod.
type PodOptions struct {
	Queue    string
	Gang     string
	GangSize string
	// Templates and Claims name the pod's claim sources.
	Templates []string
	Claims    []string
	Gated     bool
	Created   metav1.Time
	Priority  int32
	// Extended are extended resources the container asks (limits and
	// requests), e.g. {"deviceclass.resource.kubernetes.io/gpu.tessera.dev": "1"}.
	Extended map[string]string
}

// Pod returns a pod labelled for a queue.
func Pod(ns, name string, o PodOptions) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-pod-" + ns + "-" + name), Labels: map[string]string{}, CreationTimestamp: o.Created},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}, Priority: ptr.To(o.Priority)},
	}
	if o.Queue != "" {
		p.Labels[v1alpha1.QueueLabel] = o.Queue
	}
	if o.Gang != "" {
		p.Labels[v1alpha1.GangLabel] = o.Gang
	}
	if o.GangSize != "" {
		p.Labels[v1alpha1.GangSizeLabel] = o.GangSize
	}
	for i, t := range o.Templates {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: fmt.Sprintf("t%d", i), ResourceClaimTemplateName: ptr.To(t)})
	}
	for i, c := range o.Claims {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: fmt.Sprintf("c%d", i), ResourceClaimName: ptr.To(c)})
	}
	if o.Gated {
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: v1alpha1.AdmissionGate}}
	}
	if len(o.Extended) > 0 {
		c := &p.Spec.Containers[0]
		c.Resources.Limits, c.Resources.Requests = corev1.ResourceList{}, corev1.ResourceList{}
		for name, q := range o.Extended {
			c.Resources.Limits[corev1.ResourceName(name)] = resource.MustParse(q)
			c.Resources.Requests[corev1.ResourceName(name)] = resource.MustParse(q)
		}
	}
	return p
}

// ImplicitGPU is the extended resource every cluster with the
// gpu.tessera.dev DeviceClass answers to (DRAExtendedResource).
const ImplicitGPU = "deviceclass.resource.kubernetes.io/gpu.tessera.dev"

// Queue returns a Queue with memory quota and limit ("" = unset); with
// both unset it lists no resources.
func Queue(name, parent, memQuota, memLimit string) *v1alpha1.Queue {
	return queue.MemoryQueue(name, parent, memQuota, memLimit)
}

// Admitted is p as the controller leaves an admitted pod: ungated, with
// its admission time.
func Admitted(p *corev1.Pod) *corev1.Pod {
	p.Spec.SchedulingGates = nil
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[v1alpha1.AdmittedAtAnnotation] = "2026-01-01T00:00:00Z"
	return p
}

// WithCondition gives p the admission condition with reason (true for
// Admitted, false otherwise) and the message "m-<reason>".
func WithCondition(p *corev1.Pod, reason string) *corev1.Pod {
	status := corev1.ConditionFalse
	if reason == "Admitted" {
		status = corev1.ConditionTrue
	}
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: v1alpha1.AdmissionCondition, Status: status, Reason: reason, Message: "m-" + reason})
	return p
}

// Terminating is p deleted now.
func Terminating(p *corev1.Pod) *corev1.Pod {
	t := metav1.Now()
	p.DeletionTimestamp = &t
	return p
}
