package webhook_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/webhook"
)

func namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// The gater stamps the namespace's queue on claim users of a managed
// namespace and refuses a queue whose namespaceSelector leaves the pod's
// namespace out.
func TestPodGaterNamespaces(t *testing.T) {
	s := scheme(t)
	teamA := decidetest.Queue("team-a", "", "16Gi", "")
	teamA.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
	open := decidetest.Queue("default", "", "", "")
	objs := []client.Object{teamA, open,
		namespace("a-ns", map[string]string{"team": "a"}),
		namespace("b-ns", map[string]string{"team": "b"}),
		namespace("managed", map[string]string{"team": "a", v1alpha1.QueueLabel: "team-a"}),
	}
	for _, dc := range decidetest.Classes() {
		objs = append(objs, dc)
	}
	explicit := decidetest.Classes()[0].DeepCopy()
	explicit.Name, explicit.Spec.ExtendedResourceName = "whole", ptr.To("example.com/gpu")
	objs = append(objs, explicit)
	r := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
	g := &webhook.PodGater{Decoder: webhook.NewDecoder(s), Reader: r}
	ctx := context.Background()
	withClaim := decidetest.PodOptions{Templates: []string{"gpu"}}
	for _, tc := range []struct {
		name       string
		pod        *corev1.Pod
		wantDenied string // "" = allowed
		wantQueue  string // the queue label the patch sets ("" = none)
		wantGate   bool
	}{
		{"matching namespace", decidetest.Pod("a-ns", "p", decidetest.PodOptions{Queue: "team-a"}), "", "", true},
		{"other team's namespace", decidetest.Pod("b-ns", "p", decidetest.PodOptions{Queue: "team-a"}), `queue team-a takes pods only from namespaces matching its namespaceSelector "team=a"; namespace b-ns does not match`, "", false},
		{"already gated, still checked", decidetest.Pod("b-ns", "p", decidetest.PodOptions{Queue: "team-a", Gated: true}), "namespace b-ns does not match", "", false},
		{"queue without a selector takes every namespace", decidetest.Pod("b-ns", "p", decidetest.PodOptions{Queue: "default"}), "", "", true},
		{"unknown queue: the controller says so later", decidetest.Pod("b-ns", "p", decidetest.PodOptions{Queue: "nope"}), "", "", true},
		{"managed namespace: claim user gets its queue", decidetest.Pod("managed", "p", withClaim), "", "team-a", true},
		{"managed namespace: own label wins", decidetest.Pod("managed", "p", decidetest.PodOptions{Queue: "default", Templates: []string{"gpu"}}), "", "", true},
		{"managed namespace: gated without label still gets it", decidetest.Pod("managed", "p", decidetest.PodOptions{Templates: []string{"gpu"}, Gated: true}), "", "team-a", false},
		{"managed namespace: no claim, not touched", decidetest.Pod("managed", "p", decidetest.PodOptions{}), "", "", false},
		{"unmanaged namespace: unlabelled claim user not touched", decidetest.Pod("a-ns", "p", withClaim), "", "", false},
		{"managed namespace: implicit extended resource user gets its queue", decidetest.Pod("managed", "p", decidetest.PodOptions{Extended: map[string]string{decidetest.ImplicitGPU: "1"}}), "", "team-a", true},
		{"managed namespace: the implicit name of a class not created yet counts", decidetest.Pod("managed", "p", decidetest.PodOptions{Extended: map[string]string{"deviceclass.resource.kubernetes.io/later": "1"}}), "", "team-a", true},
		{"managed namespace: a class's extendedResourceName counts", decidetest.Pod("managed", "p", decidetest.PodOptions{Extended: map[string]string{"example.com/gpu": "2"}}), "", "team-a", true},
		{"managed namespace: a device plugin's resource (no class serves it) not touched", decidetest.Pod("managed", "p", decidetest.PodOptions{Extended: map[string]string{"example.com/fpga": "1"}}), "", "", false},
		{"unmanaged namespace: unlabelled extended resource user not touched", decidetest.Pod("a-ns", "p", decidetest.PodOptions{Extended: map[string]string{decidetest.ImplicitGPU: "1"}}), "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := g.Handle(ctx, request(t, admissionv1.Create, "p", tc.pod))
			msg := ""
			if resp.Result != nil {
				msg = resp.Result.Message
			}
			if tc.wantDenied != "" {
				if resp.Allowed || !strings.Contains(msg, tc.wantDenied) {
					t.Fatalf("allowed=%v %q, want refused with %q", resp.Allowed, msg, tc.wantDenied)
				}
				return
			}
			if !resp.Allowed {
				t.Fatalf("refused: %q", msg)
			}
			data, _ := json.Marshal(resp.Patches)
			if got := strings.Contains(string(data), v1alpha1.AdmissionGate); got != tc.wantGate {
				t.Errorf("patch %s adds the gate: %v, want %v", data, got, tc.wantGate)
			}
			if got := strings.Contains(string(data), `"tessera.dev~1queue"`) || strings.Contains(string(data), `"tessera.dev/queue":"`+tc.wantQueue+`"`); got != (tc.wantQueue != "") {
				t.Errorf("patch %s sets the queue label: %v, want %q", data, got, tc.wantQueue)
			}
			if tc.wantQueue != "" && !strings.Contains(string(data), `"`+tc.wantQueue+`"`) {
				t.Errorf("patch %s does not name queue %s", data, tc.wantQueue)
			}
		})
	}
	for _, o := range []decidetest.PodOptions{withClaim, {Extended: map[string]string{decidetest.ImplicitGPU: "1"}}} {
		bound := decidetest.Pod("managed", "p", o)
		bound.Spec.NodeName = "n1"
		if resp := g.Handle(ctx, request(t, admissionv1.Create, "p", bound)); resp.Allowed {
			t.Errorf("a device user (%+v) bound at creation in a managed namespace skips its queue: want refused", o)
		}
	}
}

// extended adds an extended resource to the pod's first container.
func extended(p *corev1.Pod, name string) *corev1.Pod {
	c := &p.Spec.Containers[0]
	c.Resources.Limits = corev1.ResourceList{corev1.ResourceName(name): resource.MustParse("1")}
	c.Resources.Requests = c.Resources.Limits.DeepCopy()
	return p
}

// twoContainers adds a container (an init container when init) asking res.
func twoContainers(p *corev1.Pod, res string, init bool) *corev1.Pod {
	c := corev1.Container{Name: "second", Image: "busybox", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceName(res): resource.MustParse("1")}}}
	if init {
		p.Spec.InitContainers = append(p.Spec.InitContainers, c)
	} else {
		p.Spec.Containers = append(p.Spec.Containers, c)
	}
	return p
}

// split gives the pod's first claim to its container with request r1 and
// to a second container with request r2 ("" = the whole claim).
func split(p *corev1.Pod, r1, r2 string) *corev1.Pod {
	entry := p.Spec.ResourceClaims[0].Name
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: entry, Request: r1}}
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "second", Image: "busybox",
		Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: entry, Request: r2}}}})
	return p
}

// A container with two claims of the driver's classes is refused, and so
// is a claim next to an extended resource a Tessera class serves (the
// scheduler makes a second claim for it); one claim of the driver's and
// one of another driver's (a NIC) is not.
func TestClaimValidator(t *testing.T) {
	s := scheme(t)
	objs := []client.Object{
		decidetest.Template("ns", "gpu", decidetest.Request{Memory: "4Gi"}),
		decidetest.Template("ns", "slice", decidetest.Request{Class: "timeslice.tessera.dev"}),
		decidetest.Claim("ns", "shared-gpu", decidetest.Request{}),
		decidetest.Template("ns", "nic", decidetest.Request{Class: "nic.example.com"}),
		&resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "nic.example.com"}, Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "nic.example.com"`}}},
		}},
	}
	for _, dc := range decidetest.Classes() {
		objs = append(objs, dc)
	}
	v := &webhook.ClaimValidator{Decoder: webhook.NewDecoder(s), Reader: fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build(), Driver: "gpu.tessera.dev"}
	pod := func(templates []string, claims []string, init bool) *corev1.Pod {
		p := decidetest.Pod("ns", "p", decidetest.PodOptions{Templates: templates, Claims: claims})
		c := &p.Spec.Containers[0]
		if init {
			p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox"}}
			c = &p.Spec.InitContainers[0]
		}
		for _, rc := range p.Spec.ResourceClaims {
			c.Resources.Claims = append(c.Resources.Claims, corev1.ResourceClaim{Name: rc.Name})
		}
		return p
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string // "" = allowed
	}{
		{"one claim", pod([]string{"gpu"}, nil, false), ""},
		{"two tessera templates", pod([]string{"gpu", "slice"}, nil, false), "container c uses 2 claims with gpu.tessera.dev devices (t0, t1): their limits would collide in the container's environment; use one claim with several requests instead"},
		{"template and claim", pod([]string{"gpu"}, []string{"shared-gpu"}, false), "uses 2 claims with gpu.tessera.dev devices (c0, t0)"},
		{"init container", pod([]string{"gpu", "slice"}, nil, true), "container init uses 2 claims"},
		{"tessera and a NIC", pod([]string{"gpu", "nic"}, nil, false), ""},
		{"missing template", pod([]string{"gpu", "nope"}, nil, false), "ResourceClaimTemplate nope does not exist"},
		{"a claim and a Tessera extended resource", extended(pod([]string{"gpu"}, nil, false), decidetest.ImplicitGPU),
			"container c uses 2 claims with gpu.tessera.dev devices (extended resource deviceclass.resource.kubernetes.io/gpu.tessera.dev, t0)"},
		{"a NIC claim and a Tessera extended resource", extended(pod([]string{"nic"}, nil, false), decidetest.ImplicitGPU), ""},
		{"a Tessera claim and a NIC extended resource", extended(pod([]string{"gpu"}, nil, false), "deviceclass.resource.kubernetes.io/nic.example.com"), ""},
		{"two containers with Tessera extended resources", twoContainers(extended(pod(nil, nil, false), decidetest.ImplicitGPU), decidetest.ImplicitGPU, false),
			"containers c, second ask for gpu.tessera.dev devices through extended resources"},
		{"an init container asking no more than the container reuses its request", twoContainers(extended(pod(nil, nil, false), decidetest.ImplicitGPU), decidetest.ImplicitGPU, true), ""},
		{"a Tessera claim split by request between containers", split(pod([]string{"gpu"}, nil, false), "r0", "r1"),
			"claim t0 with gpu.tessera.dev devices is split between containers: c (requests r0); second (requests r1)"},
		{"a Tessera claim given whole to two containers", split(pod([]string{"gpu"}, nil, false), "", ""), ""},
		{"a NIC claim split by request", split(pod([]string{"nic"}, nil, false), "r0", "r1"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := v.Handle(context.Background(), request(t, admissionv1.Create, "p", tc.pod))
			msg := ""
			if resp.Result != nil {
				msg = resp.Result.Message
			}
			if (tc.want == "") != resp.Allowed || !strings.Contains(msg, tc.want) {
				t.Errorf("allowed=%v %q, want %q", resp.Allowed, msg, tc.want)
			}
		})
	}
}
