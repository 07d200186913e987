package podclaims_test

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/podclaims"
	"strings"
)

func class(name, extended string, created time.Time) *resourceapi.DeviceClass {
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)}}
	if extended != "" {
		dc.Spec.ExtendedResourceName = ptr.To(extended)
	}
	return dc
}

func TestExtendedResourcesClass(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	classes := []*resourceapi.DeviceClass{
		class("gpu.tessera.dev", "nvidia.com/gpu", t0),
		class("gpu.nvidia.com", "nvidia.com/gpu", t0.Add(-time.Hour)), // older: loses
		class("b-tie", "example.com/tie", t0),
		class("a-tie", "example.com/tie", t0), // same time: the lower name wins
		class("newer", "example.com/new", t0),
		class("older", "example.com/new", t0.Add(-time.Minute)),
	}
	e := podclaims.NewExtendedResources(classes)
	for _, tc := range []struct {
		name corev1.ResourceName
		want string
	}{
		{"deviceclass.resource.kubernetes.io/gpu.tessera.dev", "gpu.tessera.dev"},
		{"deviceclass.resource.kubernetes.io/gpu.nvidia.com", "gpu.nvidia.com"},
		{"deviceclass.resource.kubernetes.io/nosuchclass", ""},
		{"nvidia.com/gpu", "gpu.tessera.dev"},
		{"example.com/tie", "a-tie"},
		{"example.com/new", "newer"},
		{"example.com/other", ""},
		{"cpu", ""},
		{"memory", ""},
		{"hugepages-2Mi", ""},
	} {
		got := ""
		if dc := e.Class(tc.name); dc != nil {
			got = dc.Name
		}
		if got != tc.want {
			t.Errorf("Class(%s) = %q, want %q", tc.name, got, tc.want)
		}
	}
	var nilExt *podclaims.ExtendedResources
	if nilExt.Class("nvidia.com/gpu") != nil {
		t.Error("a nil resolver resolved a name")
	}
}

func TestIsDRAExtendedResourceName(t *testing.T) {
	for name, want := range map[corev1.ResourceName]bool{
		"deviceclass.resource.kubernetes.io/x": true,
		"nvidia.com/gpu":                       true,
		"tessera.dev/gpu":                      true,
		"cpu":                                  false,
		"memory":                               false,
		"kubernetes.io/something":              false,
		"node.kubernetes.io/x":                 false,
		"requests.nvidia.com/gpu":              false,
		"hugepages-1Gi":                        false,
	} {
		if got := podclaims.IsDRAExtendedResourceName(name); got != want {
			t.Errorf("IsDRAExtendedResourceName(%s) = %v, want %v", name, got, want)
		}
	}
}

func ctr(name string, req map[string]string) corev1.Container {
	c := corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}}
	for k, v := range req {
		c.Resources.Requests[corev1.ResourceName(k)] = resource.MustParse(v)
		c.Resources.Limits[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	return c
}

func req(name, class string, count int64) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}
}

// TestExtendedClaimSpec checks the claim against the cases of
// kube-scheduler's own test of createRequestsAndMappings (v1.37.1): the
// request names and counts are what the scheduler allocates and the kubelet
// maps to containers.
func TestExtendedClaimSpec(t *testing.T) {
	const er = "example.com/gpu"
	t0 := time.Now()
	e := podclaims.NewExtendedResources([]*resourceapi.DeviceClass{
		class("class", er, t0), class("class1", er+"1", t0), class("classInit", er+"init", t0),
	})
	sidecar := ctr("sidecar", map[string]string{er + "init": "1"})
	sidecar.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
	for _, tc := range []struct {
		name       string
		inits, ctr []corev1.Container
		want       []resourceapi.DeviceRequest
	}{
		{"none", nil, []corev1.Container{ctr("a", map[string]string{"cpu": "1"})}, nil},
		{"a resource no class serves", nil, []corev1.Container{ctr("a", map[string]string{"example.com/other": "1"})}, nil},
		{"one resource", nil, []corev1.Container{ctr("a", map[string]string{er: "1", "cpu": "2"})},
			[]resourceapi.DeviceRequest{req("container-0-request-1", "class", 1)}},
		{"two resources in one container", nil, []corev1.Container{ctr("a", map[string]string{er: "1", er + "1": "2"})},
			[]resourceapi.DeviceRequest{req("container-0-request-0", "class", 1), req("container-0-request-1", "class1", 2)}},
		{"two containers", nil, []corev1.Container{ctr("a", map[string]string{er: "1"}), ctr("b", map[string]string{er + "1": "2"})},
			[]resourceapi.DeviceRequest{req("container-0-request-0", "class", 1), req("container-1-request-0", "class1", 2)}},
		{"one init container, one container",
			[]corev1.Container{ctr("i", map[string]string{er + "init": "2"})}, []corev1.Container{ctr("a", map[string]string{er: "1"})},
			[]resourceapi.DeviceRequest{req("container-0-request-0", "classInit", 2), req("container-1-request-0", "class", 1)}},
		{"two init containers: the larger once",
			[]corev1.Container{ctr("i1", map[string]string{er + "init": "1"}), ctr("i2", map[string]string{er + "init": "2"})},
			[]corev1.Container{ctr("a", map[string]string{er: "1"})},
			[]resourceapi.DeviceRequest{req("container-1-request-0", "classInit", 2), req("container-2-request-0", "class", 1)}},
		{"an init container reuses a sidecar's request",
			[]corev1.Container{ctr("i1", map[string]string{er + "init": "1"}), sidecar, ctr("i2", map[string]string{er + "init": "2"})},
			[]corev1.Container{ctr("a", map[string]string{er: "1"})},
			[]resourceapi.DeviceRequest{req("container-1-request-0", "classInit", 1), req("container-2-request-0", "classInit", 2), req("container-3-request-0", "class", 1)}},
		{"an init container reuses what a container asks",
			[]corev1.Container{ctr("i", map[string]string{er: "1"})}, []corev1.Container{ctr("a", map[string]string{er: "2"})},
			[]resourceapi.DeviceRequest{req("container-1-request-0", "class", 2)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{InitContainers: tc.inits, Containers: tc.ctr}}
			spec := e.ExtendedClaimSpec(pod)
			var got []resourceapi.DeviceRequest
			if spec != nil {
				got = spec.Devices.Requests
			}
			if !reflect.DeepEqual(tc.want, got) {
				t.Errorf("requests\n got %s\nwant %s", show(got), show(tc.want))
			}
		})
	}
}

func TestPodClaimsExtendedResources(t *testing.T) {
	e := podclaims.NewExtendedResources([]*resourceapi.DeviceClass{class("gpu.tessera.dev", "", time.Now())})
	made := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p-extended-resources-x7k2q"}}
	o := objs{claims: map[string]*resourceapi.ResourceClaim{"ns/p-extended-resources-x7k2q": made}, ext: e}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{ctr("main", map[string]string{"deviceclass.resource.kubernetes.io/gpu.tessera.dev": "2"})}}}

	pcs, err := podclaims.PodClaims(pod, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(pcs) != 1 || pcs[0].Exists || pcs[0].Key != "pod:u1/"+podclaims.ExtendedClaimEntry {
		t.Fatalf("before scheduling: %+v", pcs)
	}
	r := pcs[0].Claim.Spec.Devices.Requests
	if len(r) != 1 || r[0].Exactly.DeviceClassName != "gpu.tessera.dev" || r[0].Exactly.Count != 2 {
		t.Errorf("the claim the scheduler will make: %+v", r)
	}

	// Once the scheduler made it, the real claim is used, under the same key.
	pod.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: made.Name}
	pcs, err = podclaims.PodClaims(pod, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(pcs) != 1 || !pcs[0].Exists || pcs[0].Claim != made || pcs[0].Key != "pod:u1/"+podclaims.ExtendedClaimEntry {
		t.Errorf("after scheduling: %+v", pcs)
	}

	// No class serves the name: the pod gets no device through DRA.
	o.ext = podclaims.NewExtendedResources(nil)
	pod.Status.ExtendedResourceClaimStatus = nil
	if pcs, _ := podclaims.PodClaims(pod, o); len(pcs) != 0 {
		t.Errorf("without a class: %+v", pcs)
	}
}

func show(reqs []resourceapi.DeviceRequest) string {
	out := ""
	for _, r := range reqs {
		out += fmt.Sprintf("[%s %s x%d] ", r.Name, r.Exactly.DeviceClassName, r.Exactly.Count)
	}
	return out
}

type objs struct {
	claims    map[string]*resourceapi.ResourceClaim
	templates map[string]*resourceapi.ResourceClaimTemplate
	ext       *podclaims.ExtendedResources
}

func (o objs) ExtendedResources() *podclaims.ExtendedResources { return o.ext }

func (o objs) Claim(ns, name string) *resourceapi.ResourceClaim { return o.claims[ns+"/"+name] }
func (o objs) Template(ns, name string) *resourceapi.ResourceClaimTemplate {
	return o.templates[ns+"/"+name]
}

func TestPodClaims(t *testing.T) {
	shared := decidetest.Claim("ns", "shared", decidetest.Request{Memory: "8Gi"})
	gen := decidetest.Claim("ns", "p-t0-abc", decidetest.Request{})
	o := objs{
		claims:    map[string]*resourceapi.ResourceClaim{"ns/shared": shared, "ns/p-t0-abc": gen},
		templates: map[string]*resourceapi.ResourceClaimTemplate{"ns/tmpl": decidetest.Template("ns", "tmpl", decidetest.Request{})},
	}
	p := decidetest.Pod("ns", "p", decidetest.PodOptions{Templates: []string{"tmpl"}, Claims: []string{"shared"}})
	pcs, err := podclaims.PodClaims(p, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(pcs) != 2 || pcs[0].Exists || pcs[0].Key != "pod:uid-pod-ns-p/t0" || pcs[1].Key != "claim:ns/shared" || !pcs[1].Exists {
		t.Errorf("unexpected claims %+v", pcs)
	}
	// Once the resourceclaim controller made the claim, it is used.
	p.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "t0", ResourceClaimName: ptr.To("p-t0-abc")}}
	pcs, _ = podclaims.PodClaims(p, o)
	if !pcs[0].Exists || pcs[0].Claim != gen || pcs[0].Key != "pod:uid-pod-ns-p/t0" {
		t.Errorf("generated claim not used: %+v", pcs[0])
	}
	p2 := decidetest.Pod("ns", "p2", decidetest.PodOptions{Templates: []string{"missing"}})
	if _, err := podclaims.PodClaims(p2, o); err == nil || !strings.Contains(err.Error(), "ResourceClaimTemplate missing does not exist") {
		t.Errorf("missing template: %v", err)
	}
}
