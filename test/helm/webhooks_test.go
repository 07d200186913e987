package helm

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/webhook"
	"github.com/tessera-dev/tessera/test/testutil"
)

// TestWebhooksInAPIServer installs the chart into a real kube-apiserver and
// serves the controller's webhook handlers in this process on the URL the
// chart's configurations name: a queue's namespaceSelector, managed
// namespaces (label and gate stamped), two Tessera claims in one container,
// and the Queue webhook on DELETE, as the API server calls them.
func TestWebhooksInAPIServer(t *testing.T) {
	s, ctx, _ := chartAPIServer(t)
	port := testutil.FreePort(t)
	s.installChart(t,
		"--set", fmt.Sprintf("webhook.port=%d", port),
		"--set-string", fmt.Sprintf("webhook.url=https://127.0.0.1:%d", port))
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(s.config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	serveWebhooks(t, ctx, c, port, nil)

	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: map[string]string{"team": "a"}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-b", Labels: map[string]string{"team": "b"}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "managed", Labels: map[string]string{"team": "a", "tessera.dev/queue": "team-a"}}},
		&resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "nic.example.com"}, Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "nic.example.com"`}}}}},
	}
	for _, ns := range []string{"team-a", "team-b", "managed"} {
		objs = append(objs, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}})
		for _, tc := range []struct{ name, class string }{{"gpu", "gpu.tessera.dev"}, {"slice", "timeslice.tessera.dev"}, {"nic", "nic.example.com"}} {
			objs = append(objs, &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: tc.name}, Spec: resourceapi.ResourceClaimTemplateSpec{
				Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "r", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: tc.class}}}}},
			}})
		}
	}
	// The webhooks are served once the queue webhook refuses an unknown
	// parent (its failurePolicy is Ignore: a timeout would let it in).
	for deadline := time.Now().Add(30 * time.Second); ; {
		err := c.Create(ctx, &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Spec: v1alpha1.QueueSpec{Parent: "nope"}}, client.DryRunAll)
		if err != nil && strings.Contains(err.Error(), "does not exist") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the webhook server does not answer: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	teamA := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}, Spec: v1alpha1.QueueSpec{Parent: "org", NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}}}
	org := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "org"}}
	objs = append(objs, org, teamA)
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}

	pod := func(ns, name string, labels map[string]string, claims ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}}}
		for _, cl := range claims {
			p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: cl, ResourceClaimTemplateName: ptr.To(cl)})
			p.Spec.Containers[0].Resources.Claims = append(p.Spec.Containers[0].Resources.Claims, corev1.ResourceClaim{Name: cl})
		}
		return p
	}
	create := func(p *corev1.Pod) (*corev1.Pod, error) { return p, c.Create(ctx, p, client.DryRunAll) }
	refused := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want refused with %q", what, err, want)
		}
	}
	_, err = create(pod("team-b", "p", map[string]string{"tessera.dev/queue": "team-a"}, "gpu"))
	refused("team-b names team-a's queue", err, `queue team-a takes pods only from namespaces matching its namespaceSelector "team=a"; namespace team-b does not match`)
	if p, err := create(pod("team-a", "p", map[string]string{"tessera.dev/queue": "team-a"}, "gpu")); err != nil || len(p.Spec.SchedulingGates) != 1 {
		t.Errorf("team-a names its queue: %v, gates %v", err, p.Spec.SchedulingGates)
	}
	if p, err := create(pod("managed", "p", nil, "gpu")); err != nil || p.Labels["tessera.dev/queue"] != "team-a" || len(p.Spec.SchedulingGates) != 1 {
		t.Errorf("claim user in a managed namespace: %v, labels %v, gates %v; want queue team-a and the gate", err, p.Labels, p.Spec.SchedulingGates)
	}
	if p, err := create(pod("managed", "p", nil)); err != nil || p.Labels["tessera.dev/queue"] != "" || len(p.Spec.SchedulingGates) != 0 {
		t.Errorf("pod without claims in a managed namespace: %v, labels %v, gates %v; want untouched", err, p.Labels, p.Spec.SchedulingGates)
	}
	if p, err := create(pod("team-b", "p", nil, "gpu")); err != nil || len(p.Spec.SchedulingGates) != 0 {
		t.Errorf("unlabelled claim user elsewhere: %v, gates %v; want untouched", err, p.Spec.SchedulingGates)
	}
	_, err = create(pod("team-b", "p", nil, "gpu", "slice"))
	refused("one container, two Tessera claims", err, "use one claim with several requests instead")
	if _, err := create(pod("team-b", "p", nil, "gpu", "nic")); err != nil {
		t.Errorf("one Tessera claim and a NIC claim: %v", err)
	}
	refused("deleting a parent queue", c.Delete(ctx, org.DeepCopy()), "queue org is the parent of team-a")

	// Devices through extended resources: the implicit name of Tessera's
	// class is gated in a managed namespace, and next to a Tessera claim in
	// one container it is a second claim.
	extended := func(p *corev1.Pod, res string) *corev1.Pod {
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(res): resource.MustParse("1")}
		return p
	}
	if p, err := create(extended(pod("managed", "p", nil), "deviceclass.resource.kubernetes.io/gpu.tessera.dev")); err != nil || p.Labels["tessera.dev/queue"] != "team-a" || len(p.Spec.SchedulingGates) != 1 {
		t.Errorf("extended-resource user in a managed namespace: %v, labels %v, gates %v; want queue team-a and the gate", err, p.Labels, p.Spec.SchedulingGates)
	}
	if p, err := create(extended(pod("managed", "p", nil), "example.com/fpga")); err != nil || len(p.Spec.SchedulingGates) != 0 {
		t.Errorf("a device plugin's resource in a managed namespace: %v, gates %v; want untouched", err, p.Spec.SchedulingGates)
	}
	_, err = create(extended(pod("team-b", "p", nil, "gpu"), "deviceclass.resource.kubernetes.io/gpu.tessera.dev"))
	refused("one container, a Tessera claim and a Tessera extended resource", err, "use one claim with several requests instead")
	if _, err := create(extended(pod("team-b", "p", nil, "nic"), "deviceclass.resource.kubernetes.io/gpu.tessera.dev")); err != nil {
		t.Errorf("a NIC claim and a Tessera extended resource: %v", err)
	}
}

// The chart's pod webhooks send exactly the pods pkg/control/webhook's match
// conditions name (the controller writes the same conditions when it
// keeps its own configurations, as a host process).
func TestWebhookMatchConditions(t *testing.T) {
	objs := renderTyped(t, valueSets[0])
	squash := func(s string) string { return strings.Join(strings.Fields(s), "") }
	m := get[*admissionregistrationv1.MutatingWebhookConfiguration](t, objs, "MutatingWebhookConfiguration", ReleaseName+"-pod-admission")
	v := get[*admissionregistrationv1.ValidatingWebhookConfiguration](t, objs, "ValidatingWebhookConfiguration", ReleaseName+"-queue-validation")
	want := map[string]string{"uses-devices": webhook.UsesDevicesExpression, "container-uses-several-devices": webhook.SeveralDevicesExpression}
	seen := 0
	check := func(conds []admissionregistrationv1.MatchCondition) {
		for _, c := range conds {
			w, ok := want[c.Name]
			if !ok {
				t.Errorf("match condition %s is not one of pkg/control/webhook's", c.Name)
				continue
			}
			seen++
			if squash(c.Expression) != squash(w) {
				t.Errorf("match condition %s:\nchart %s\nGo    %s", c.Name, c.Expression, w)
			}
		}
	}
	for _, wh := range m.Webhooks {
		check(wh.MatchConditions)
	}
	for _, wh := range v.Webhooks {
		check(wh.MatchConditions)
	}
	if seen != len(want) {
		t.Errorf("found %d of the %d match conditions", seen, len(want))
	}
}

// serveWebhooks serves the controller's pod gate and claim and Queue
// validation (and what extra registers) on 127.0.0.1:port, with the CA
// kept as the controller keeps it, and gives the chart's webhook
// configurations that CA.
func serveWebhooks(t *testing.T, ctx context.Context, c client.Client, port int, extra func(srv ctrlwebhook.Server, dec admission.Decoder)) {
	t.Helper()
	ca, err := webhook.EnsureCA(ctx, c, DefaultNamespace, ReleaseName+"-webhook-tls")
	if err != nil {
		t.Fatal(err)
	}
	certs := &webhook.ServingCerts{CA: ca, Hosts: []string{"127.0.0.1"}}
	srv := ctrlwebhook.NewServer(ctrlwebhook.Options{Host: "127.0.0.1", Port: port, TLSOpts: []func(*tls.Config){func(c *tls.Config) {
		c.GetCertificate = certs.GetCertificate
	}}})
	dec := webhook.NewDecoder(c.Scheme())
	if extra != nil {
		extra(srv, dec)
	}
	srv.Register(webhook.PodsPath, &ctrlwebhook.Admission{Handler: &webhook.PodGater{Decoder: dec, Reader: c}})
	srv.Register(webhook.ClaimsPath, &ctrlwebhook.Admission{Handler: &webhook.ClaimValidator{Decoder: dec, Reader: c, Driver: "gpu.tessera.dev"}})
	srv.Register(webhook.QueuesPath, &ctrlwebhook.Admission{Handler: &webhook.QueueValidator{Decoder: dec, Reader: c}})
	go func() { _ = srv.Start(ctx) }()
	if err := webhook.PatchCABundle(ctx, c, ReleaseName+"-pod-admission", ReleaseName+"-queue-validation", ca.CertPEM); err != nil {
		t.Fatal(err)
	}
}
