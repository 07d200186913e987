package webhook_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/webhook"
)

func scheme(t *testing.T) *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func request(t *testing.T, op admissionv1.Operation, name string, obj any) admission.Request {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: op, Name: name, Object: runtime.RawExtension{Raw: raw}}}
}

func TestPodGater(t *testing.T) {
	g := &webhook.PodGater{Decoder: webhook.NewDecoder(scheme(t))}
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		pod       *corev1.Pod
		wantPatch bool
	}{
		{"labelled pod is gated", decidetest.Pod("ns", "p", decidetest.PodOptions{Queue: "team-a"}), true},
		{"unlabelled pod is not touched", decidetest.Pod("ns", "p", decidetest.PodOptions{}), false},
		{"already gated", decidetest.Pod("ns", "p", decidetest.PodOptions{Queue: "team-a", Gated: true}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := g.Handle(ctx, request(t, admissionv1.Create, "p", tc.pod))
			if !resp.Allowed {
				t.Fatalf("denied: %v", resp.Result)
			}
			if got := len(resp.Patches) > 0; got != tc.wantPatch {
				t.Fatalf("patches %v, want a patch: %v", resp.Patches, tc.wantPatch)
			}
			if tc.wantPatch {
				data, _ := json.Marshal(resp.Patches)
				if !strings.Contains(string(data), v1alpha1.AdmissionGate) {
					t.Errorf("patch does not add the gate: %s", data)
				}
			}
		})
	}
	bound := decidetest.Pod("ns", "p", decidetest.PodOptions{Queue: "team-a"})
	bound.Spec.NodeName = "n1"
	if resp := g.Handle(ctx, request(t, admissionv1.Create, "p", bound)); !resp.Allowed || len(resp.Patches) > 0 || len(resp.Warnings) == 0 {
		t.Errorf("a pod bound at creation cannot be gated: want allowed, unpatched, with a warning; got %+v", resp)
	}
}

func TestQueueValidator(t *testing.T) {
	s := scheme(t)
	existing := []*v1alpha1.Queue{decidetest.Queue("org", "", "", ""), decidetest.Queue("team-a", "org", "16Gi", "")}
	b := fake.NewClientBuilder().WithScheme(s)
	for _, q := range existing {
		b = b.WithObjects(q)
	}
	v := &webhook.QueueValidator{Decoder: webhook.NewDecoder(s), Reader: b.Build()}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		op   admissionv1.Operation
		q    *v1alpha1.Queue
		want string // "" = allowed
	}{
		{"valid", admissionv1.Create, decidetest.Queue("team-b", "org", "8Gi", "16Gi"), ""},
		{"unknown parent", admissionv1.Create, decidetest.Queue("team-b", "nope", "", ""), `queue "nope" does not exist`},
		{"quota above limit", admissionv1.Create, decidetest.Queue("team-b", "org", "32Gi", "16Gi"), "quota 32Gi is above limit 16Gi"},
		{"cycle", admissionv1.Update, decidetest.Queue("org", "team-a", "", ""), "would make a cycle (org -> team-a -> org)"},
		{"delete a parent", admissionv1.Delete, &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "org"}}, "queue org is the parent of team-a"},
		{"delete a leaf", admissionv1.Delete, &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := request(t, tc.op, tc.q.Name, tc.q)
			if tc.op == admissionv1.Delete {
				req.Object = runtime.RawExtension{}
			}
			resp := v.Handle(ctx, req)
			msg := ""
			if resp.Result != nil {
				msg = resp.Result.Message
			}
			if (tc.want == "") != resp.Allowed || !strings.Contains(msg, tc.want) {
				t.Errorf("allowed=%v %q, want %q", resp.Allowed, msg, tc.want)
			}
			if len(resp.Warnings) > 0 {
				t.Errorf("warnings %v", resp.Warnings)
			}
		})
	}
	// Canary queues: a child naming another controller than its root's is
	// allowed with a warning that says it is not followed and the fix.
	split := decidetest.Queue("team-b", "org", "", "")
	split.Spec.ControllerName = "canary"
	resp := v.Handle(ctx, request(t, admissionv1.Create, split.Name, split))
	if !resp.Allowed || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "set spec.controllerName on org") {
		t.Errorf("a split child: allowed=%v, warnings %v; want allowed with a warning naming the fix", resp.Allowed, resp.Warnings)
	}
	root := decidetest.Queue("lab", "", "", "")
	root.Spec.ControllerName = "canary"
	if resp := v.Handle(ctx, request(t, admissionv1.Create, root.Name, root)); !resp.Allowed || len(resp.Warnings) != 0 {
		t.Errorf("a root naming the canary: allowed=%v, warnings %v", resp.Allowed, resp.Warnings)
	}
}

// Two replicas start at once: both find no CA secret, the other one
// creates it first. This one must use the other's CA, not fail.
func TestEnsureCALosesCreateRace(t *testing.T) {
	ctx := context.Background()
	store := fake.NewClientBuilder().WithScheme(scheme(t)).Build()
	other, err := webhook.EnsureCA(ctx, store, "kube-system", "other")
	if err != nil {
		t.Fatal(err)
	}
	c := interceptor.NewClient(store, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			winner := &corev1.Secret{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "other"}, winner); err != nil {
				return err
			}
			winner.ObjectMeta = metav1.ObjectMeta{Namespace: obj.GetNamespace(), Name: obj.GetName()}
			if err := c.Create(ctx, winner); err != nil {
				return err
			}
			return c.Create(ctx, obj, opts...) // AlreadyExists
		},
	})
	ca, err := webhook.EnsureCA(ctx, c, "kube-system", "ca")
	if err != nil {
		t.Fatalf("losing the create race: %v", err)
	}
	if string(ca.CertPEM) != string(other.CertPEM) {
		t.Error("the replica that lost the race serves its own CA, not the one stored")
	}
}

func TestServingCert(t *testing.T) {
	s := scheme(t)
	c := fake.NewClientBuilder().WithScheme(s).Build()
	ctx := context.Background()
	ca, err := webhook.EnsureCA(ctx, c, "kube-system", "ca")
	if err != nil {
		t.Fatal(err)
	}
	again, err := webhook.EnsureCA(ctx, c, "kube-system", "ca")
	if err != nil || string(again.CertPEM) != string(ca.CertPEM) {
		t.Fatalf("a second replica got another CA: %v", err)
	}
	// A controller that runs for longer than a certificate lives keeps
	// serving a valid one: it is reissued before it expires.
	now := time.Now()
	certs := &webhook.ServingCerts{CA: ca, Hosts: []string{"127.0.0.1", "svc.ns.svc"}, Now: func() time.Time { return now }}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)
	var serials []string
	for _, step := range []time.Duration{0, 24 * time.Hour, webhook.ServingValidity - webhook.RenewBefore, webhook.ServingValidity, 2 * webhook.ServingValidity} {
		now = now.Add(step)
		cert, err := certs.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cert.Leaf.Verify(x509.VerifyOptions{DNSName: "svc.ns.svc", Roots: pool, CurrentTime: now}); err != nil {
			t.Fatalf("after %v: the served certificate does not verify: %v", step, err)
		}
		if left := cert.Leaf.NotAfter.Sub(now); left < webhook.RenewBefore {
			t.Errorf("after %v: served a certificate with %v left", step, left)
		}
		serials = append(serials, cert.Leaf.SerialNumber.String())
	}
	if serials[0] != serials[1] {
		t.Error("reissued a day after issue")
	}
	if serials[1] == serials[2] || serials[2] == serials[3] || serials[3] == serials[4] {
		t.Errorf("not reissued at renewal time: %v", serials)
	}
}
