package installcheck

import (
	"bytes"
	"context"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

func TestRun(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	class := func(name string) client.Object {
		return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	slice := func(driver string) client.Object {
		return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s-" + driver}, Spec: resourceapi.ResourceSliceSpec{
			Driver: driver, NodeName: ptr.To("node-1"), Pool: resourceapi.ResourcePool{Name: "node-1", ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "gpu-0"}},
		}}
	}
	queue := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	// gating is the pod webhook: it adds the admission gate to queued pods.
	gating := interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		if pod, ok := obj.(*corev1.Pod); ok && pod.Labels[v1alpha1.QueueLabel] != "" {
			pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: v1alpha1.AdmissionGate})
		}
		return c.Create(ctx, obj, opts...)
	}}
	sandbox := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "tessera-sandbox"}}
	good := []client.Object{class("gpu.tessera.dev"), class("mig.tessera.dev"), slice("gpu.tessera.dev"), queue, sandbox}
	ns := func(name string, labels ...string) client.Object {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
		for i := 0; i+1 < len(labels); i += 2 {
			n.Labels[labels[i]] = labels[i+1]
		}
		return n
	}
	const psa = "pod-security.kubernetes.io/enforce"
	for _, tc := range []struct {
		name    string
		objs    []client.Object
		webhook interceptor.Funcs
		queue   string
		want    []string // substrings of the error; none: success
		out     []string // substrings of the report
	}{
		{name: "sandbox policy missing", objs: good[:4], webhook: gating, queue: "default", want: []string{"sandbox policy", "ValidatingAdmissionPolicy tessera-sandbox", "admissionPolicies.sandbox.enabled"}},
		{name: "managed namespaces with and without Pod Security", webhook: gating, queue: "default",
			objs: append(append([]client.Object(nil), good...),
				ns("team-a", "tessera.dev/queue", "a", psa, "baseline"), ns("team-b", "tessera.dev/queue", "b", psa, "privileged"),
				ns("team-c", "tessera.dev/queue", "c"), ns("lab", "tessera.dev/queue", "l", "tessera.dev/sandbox", "exempt"), ns("plain")),
			out: []string{"WARN tenant namespaces: managed namespaces without pod-security.kubernetes.io/enforce=baseline (or restricted): [team-b team-c]", "exempt from the sandbox", "[lab]", "ok   sandbox policy"}},
		{name: "managed namespaces all baseline or restricted", webhook: gating, queue: "default",
			objs: append(append([]client.Object(nil), good...), ns("team-a", "tessera.dev/queue", "a", psa, "baseline"), ns("team-b", "tessera.dev/queue", "b", psa, "restricted")),
			out:  []string{"ok   tenant namespaces: 2 managed namespaces enforce Pod Security baseline or restricted"}},
		{name: "healthy", objs: good, webhook: gating, queue: "default"},
		{name: "no webhook check without a queue", objs: good, queue: ""},
		{name: "missing class", objs: good[1:], webhook: gating, queue: "default", want: []string{"device classes", "gpu.tessera.dev"}},
		{name: "only another driver's slices", objs: []client.Object{class("gpu.tessera.dev"), class("mig.tessera.dev"), slice("nic.example.com"), queue}, webhook: gating, queue: "default", want: []string{"no node publishes gpu.tessera.dev devices", "nodeAffinity"}},
		{name: "webhook down", objs: good, queue: "default", want: []string{"pod webhook", "was not gated"}},
		{name: "queue missing", objs: good[:3], webhook: gating, queue: "default", want: []string{`queue "default" does not exist`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tc.objs...).
				WithIndex(&resourceapi.ResourceSlice{}, "spec.driver", func(o client.Object) []string { return []string{o.(*resourceapi.ResourceSlice).Spec.Driver} }).
				WithInterceptorFuncs(tc.webhook).Build()
			var out bytes.Buffer
			err := Run(context.Background(), c, Options{Driver: "gpu.tessera.dev", DeviceClasses: []string{"gpu.tessera.dev", "mig.tessera.dev"}, Namespace: "tessera-system", Queue: tc.queue, Image: "pause", SandboxPolicy: "tessera-sandbox"}, &out)
			for _, o := range tc.out {
				if !strings.Contains(out.String(), o) {
					t.Errorf("report lacks %q:\n%s", o, out.String())
				}
			}
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected failure: %v\n%s", err, out.String())
				}
			} else {
				if err == nil {
					t.Fatalf("passed, want a failure containing %q\n%s", tc.want, out.String())
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
			}
			var pods corev1.PodList
			if err := c.List(context.Background(), &pods); err != nil || len(pods.Items) != 0 {
				t.Errorf("the check left pods behind: %v, %v", pods.Items, err)
			}
		})
	}
}
