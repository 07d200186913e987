package helm

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/test/apiserver"

	"github.com/tessera-dev/tessera/test/testutil"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// apiServer is a private etcd + kube-apiserver (test/apiserver): no
// kubelet, scheduler or controllers, so objects are stored and admitted but
// nothing runs. Enough to check that every object the chart renders is
// accepted by a 1.37 API server (CEL in the admission policy and device
// classes compiles, the CRD is established before the default Queue) and
// that the RBAC and the admission policy allow and deny what they should.
type apiServer struct {
	kubeconfig string
	config     *rest.Config
}

// installChart runs `helm upgrade --install` of the chart into the API
// server with the local-cluster values, mock devices and extra, and fails
// the test if it does not install; it returns the arguments (to install
// again with more).
func (s *apiServer) installChart(t *testing.T, extra ...string) []string {
	t.Helper()
	install := append([]string{"upgrade", "--install", ReleaseName, ChartPath,
		"--kubeconfig", s.kubeconfig, "--namespace", DefaultNamespace, "--create-namespace",
		"--values", LocalClusterValues,
		"--set-string", "kubeletPlugin.mock.deviceRoot=/var/lib/tessera-helm-test/mock-devices",
		"--timeout", "2m"}, extra...)
	if out, err := runHelm(t, install...); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	return install
}

// chartAPIServer starts etcd and kube-apiserver for a test that installs
// the chart (skipped with -short), with a context for the test and an
// admin client.
func chartAPIServer(t *testing.T) (*apiServer, context.Context, kubernetes.Interface) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	helmBinary(t)
	s := startAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	admin, err := kubernetes.NewForConfig(s.config)
	if err != nil {
		t.Fatal(err)
	}
	return s, ctx, admin
}

func startAPIServer(t *testing.T) *apiServer {
	t.Helper()
	s, err := apiserver.Start(t, apiserver.Options{Flags: map[string]string{
		"endpoint-reconciler-type":     "none",
		"enable-priority-and-fairness": "false",
	}})
	if err != nil {
		t.Fatal(err)
	}
	return &apiServer{kubeconfig: s.Kubeconfig, config: s.Config}
}

// notesExample decodes the ResourceClaimTemplate and Pod of the heredoc in
// NOTES.txt.
func notesExample(t *testing.T, notes string) (*resourceapi.ResourceClaimTemplate, *corev1.Pod) {
	t.Helper()
	_, rest, ok := strings.Cut(notes, "<<'YAML'\n")
	if !ok {
		t.Fatalf("NOTES has no example:\n%s", notes)
	}
	var lines []string
	for _, l := range strings.Split(rest, "\n") {
		if strings.TrimSpace(l) == "YAML" {
			break
		}
		lines = append(lines, strings.TrimPrefix(l, "     "))
	}
	docs := strings.Split(strings.Join(lines, "\n"), "\n---\n")
	if len(docs) != 2 {
		t.Fatalf("NOTES example has %d documents, want 2", len(docs))
	}
	tmpl := &resourceapi.ResourceClaimTemplate{}
	pod := &corev1.Pod{}
	if err := yaml.UnmarshalStrict([]byte(docs[0]), tmpl); err != nil {
		t.Fatalf("NOTES claim template: %v\n%s", err, docs[0])
	}
	if err := yaml.UnmarshalStrict([]byte(docs[1]), pod); err != nil {
		t.Fatalf("NOTES pod: %v\n%s", err, docs[1])
	}
	return tmpl, pod
}

// impersonate returns a client acting as a service account of a pod on node.
func (s *apiServer) impersonate(t *testing.T, namespace, sa, node string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(s.config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + namespace + ":" + sa,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	if node != "" {
		cfg.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {node}}
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// as returns a client acting as user in groups (the kubelet, the scheduler).
func (s *apiServer) as(t *testing.T, user string, groups ...string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(s.config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func slice(name, node, driver string) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driver,
			NodeName: ptr.To(node),
			Pool:     resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices:  []resourceapi.Device{{Name: "gpu-0"}},
		},
	}
}

// TestInstallIntoAPIServer installs, upgrades and uninstalls the chart in a
// real kube-apiserver and checks what its RBAC and admission policy allow.
func TestInstallIntoAPIServer(t *testing.T) {
	s, ctx, admin := chartAPIServer(t)

	// The local cluster's values: the webhooks are called on 127.0.0.1 (a
	// free port nothing listens on), so this API server dials nothing but
	// loopback; the queue webhook's Ignore lets the default Queue in.
	webhookPort := testutil.FreePort(t)
	install := s.installChart(t,
		"--set", fmt.Sprintf("webhook.port=%d", webhookPort),
		"--set-string", fmt.Sprintf("webhook.url=https://127.0.0.1:%d", webhookPort),
		"--set", "deviceClasses.extendedResourceName.enabled=true",
		"--set-string", "deviceClasses.defaults.enforcement=auto")

	// Everything is there, the CEL compiled.
	ds, err := admin.AppsV1().DaemonSets(DefaultNamespace).Get(ctx, pluginName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.AppsV1().Deployments(DefaultNamespace).Get(ctx, controllerName, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gpu.tessera.dev", "mig.tessera.dev", "timeslice.tessera.dev"} {
		if _, err := admin.ResourceV1().DeviceClasses().Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("DeviceClass %s: %v", name, err)
		}
	}
	queue, err := admin.CoreV1().RESTClient().Get().AbsPath("/apis/tessera.dev/v1alpha1/queues/default").DoRaw(ctx)
	if err != nil {
		t.Errorf("default Queue: %v", err)
	} else if !strings.Contains(string(queue), `"kind":"Queue"`) {
		t.Errorf("default Queue = %s", queue)
	}
	// The policy's CEL is type-checked by kube-controller-manager, which
	// does not run here; every variable and validation is evaluated below,
	// on allowed and on denied requests.
	vapName := pluginName + "-resourceslices"
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, vapName, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}

	// The kubelet plugin writes slices of its own node, nothing else.
	onA := s.impersonate(t, DefaultNamespace, pluginName, "node-a")
	// The API server loads new policies within a few seconds; a dry run
	// shows when it enforces this one.
	for deadline := time.Now().Add(60 * time.Second); ; {
		_, err := onA.ResourceV1().ResourceSlices().Create(ctx, slice("probe", "node-b", "gpu.tessera.dev"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the admission policy is not enforced 60s after install")
		}
		time.Sleep(500 * time.Millisecond)
	}
	if _, err := onA.ResourceV1().ResourceSlices().Create(ctx, slice("node-a-gpus", "node-a", "gpu.tessera.dev"), metav1.CreateOptions{}); err != nil {
		t.Errorf("plugin on node-a cannot create node-a's slice: %v", err)
	}
	denied := func(what string, err error, want string) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: allowed", what)
		} else if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v (want a denial naming %q)", what, err, want)
		}
	}
	_, err = onA.ResourceV1().ResourceSlices().Create(ctx, slice("node-b-gpus", "node-b", "gpu.tessera.dev"), metav1.CreateOptions{})
	denied("plugin on node-a creates node-b's slice", err, "ResourceSlices of node 'node-b'")
	_, err = onA.ResourceV1().ResourceSlices().Create(ctx, slice("node-a-other", "node-a", "other.example.com"), metav1.CreateOptions{})
	denied("plugin creates a slice of another driver", err, "driver gpu.tessera.dev")
	_, err = s.impersonate(t, DefaultNamespace, pluginName, "").ResourceV1().ResourceSlices().Create(ctx, slice("x", "node-a", "gpu.tessera.dev"), metav1.CreateOptions{})
	denied("plugin without a node claim", err, "no node association")
	if _, err := admin.ResourceV1().ResourceSlices().Create(ctx, slice("node-b-gpus", "node-b", "gpu.tessera.dev"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = onA.ResourceV1().ResourceSlices().Delete(ctx, "node-b-gpus", metav1.DeleteOptions{})
	denied("plugin on node-a deletes node-b's slice", err, "node 'node-b'")
	if err := onA.ResourceV1().ResourceSlices().Delete(ctx, "node-a-gpus", metav1.DeleteOptions{}); err != nil {
		t.Errorf("plugin on node-a cannot delete its own slice: %v", err)
	}
	// The controller only reads slices.
	_, err = s.impersonate(t, DefaultNamespace, controllerName, "").ResourceV1().ResourceSlices().Create(ctx, slice("c", "node-a", "gpu.tessera.dev"), metav1.CreateOptions{})
	denied("controller creates a slice", err, "forbidden")

	// What each service account may do, as the authorizer sees it.
	can := func(sa string, attrs authorizationv1.ResourceAttributes) bool {
		t.Helper()
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:" + DefaultNamespace + ":" + sa,
			Groups:             []string{"system:serviceaccounts", "system:authenticated"},
			ResourceAttributes: &attrs,
		}}
		res, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return res.Status.Allowed
	}
	type check struct {
		sa    string
		attrs authorizationv1.ResourceAttributes
		want  bool
	}
	claimDriver := func(verb, name string) authorizationv1.ResourceAttributes {
		return authorizationv1.ResourceAttributes{Group: "resource.k8s.io", Resource: "resourceclaims", Subresource: "driver", Verb: verb, Name: name, Namespace: "team-a"}
	}
	for _, c := range []check{
		{pluginName, claimDriver("associated-node:patch", "gpu.tessera.dev"), false},
		{pluginName, claimDriver("associated-node:update", "gpu.tessera.dev"), true},
		{pluginName, claimDriver("arbitrary-node:patch", "gpu.tessera.dev"), false},
		{pluginName, claimDriver("associated-node:patch", "other.example.com"), false},
		{pluginName, authorizationv1.ResourceAttributes{Group: "resource.k8s.io", Resource: "resourceclaims", Subresource: "status", Verb: "update", Namespace: "team-a"}, true},
		{pluginName, authorizationv1.ResourceAttributes{Group: "resource.k8s.io", Resource: "resourceclaims", Subresource: "binding", Verb: "patch", Namespace: "team-a"}, false},
		{pluginName, authorizationv1.ResourceAttributes{Group: "resource.k8s.io", Resource: "resourceclaims", Verb: "get", Namespace: "team-a"}, true},
		{pluginName, authorizationv1.ResourceAttributes{Group: "resource.k8s.io", Resource: "resourceclaims", Verb: "list"}, false},
		{pluginName, authorizationv1.ResourceAttributes{Resource: "nodes", Verb: "get", Name: "node-a"}, true},
		{pluginName, authorizationv1.ResourceAttributes{Resource: "pods", Verb: "list"}, false},
		{pluginName, authorizationv1.ResourceAttributes{Resource: "secrets", Verb: "get", Namespace: DefaultNamespace}, false},
		{controllerName, authorizationv1.ResourceAttributes{Resource: "pods", Verb: "patch", Namespace: "team-a"}, true},
		{controllerName, authorizationv1.ResourceAttributes{Resource: "pods", Subresource: "eviction", Verb: "create", Namespace: "team-a"}, true},
		// Reclaim past a budget (controller.reclaimPastBudgets): the policy
		// <controller>-pod-deletes narrows it (TestAdmissionPolicies).
		{controllerName, authorizationv1.ResourceAttributes{Resource: "pods", Verb: "delete", Namespace: "team-a"}, true},
		{controllerName, authorizationv1.ResourceAttributes{Resource: "pods", Verb: "deletecollection", Namespace: "team-a"}, false},
		{controllerName, authorizationv1.ResourceAttributes{Group: "tessera.dev", Resource: "queues", Subresource: "status", Verb: "update", Name: "default"}, true},
		{controllerName, authorizationv1.ResourceAttributes{Group: "tessera.dev", Resource: "queues", Verb: "update", Name: "default"}, false},
		{controllerName, authorizationv1.ResourceAttributes{Group: "resource.k8s.io", Resource: "resourceclaims", Verb: "update", Namespace: "team-a"}, false},
		{controllerName, authorizationv1.ResourceAttributes{Group: "admissionregistration.k8s.io", Resource: "mutatingwebhookconfigurations", Verb: "update", Name: "tessera-pod-admission"}, true},
		{controllerName, authorizationv1.ResourceAttributes{Group: "admissionregistration.k8s.io", Resource: "mutatingwebhookconfigurations", Verb: "patch", Name: "someone-else"}, false},
		{controllerName, authorizationv1.ResourceAttributes{Resource: "secrets", Verb: "update", Name: "tessera-webhook-tls", Namespace: DefaultNamespace}, true},
		{controllerName, authorizationv1.ResourceAttributes{Resource: "secrets", Verb: "get", Name: "other", Namespace: DefaultNamespace}, false},
		{controllerName, authorizationv1.ResourceAttributes{Group: "coordination.k8s.io", Resource: "leases", Verb: "update", Namespace: DefaultNamespace}, true},
	} {
		if got := can(c.sa, c.attrs); got != c.want {
			t.Errorf("%s %s %s/%s %s: allowed=%v, want %v", c.sa, c.attrs.Verb, c.attrs.Resource, c.attrs.Subresource, c.attrs.Name, got, c.want)
		}
	}

	// The example NOTES.txt gives is valid: the claim template is accepted;
	// its pod carries the queue label, so while no controller serves the
	// webhook it is refused (failurePolicy Fail) and the same pod without
	// the label is not sent to the webhook at all.
	notes, err := runHelm(t, "get", "notes", ReleaseName, "--kubeconfig", s.kubeconfig, "--namespace", DefaultNamespace)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, pod := notesExample(t, notes)
	ns := "notes-example"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Errorf("NOTES claim template refused: %v", err)
	}
	_, err = admin.CoreV1().Pods(ns).Create(ctx, pod.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err == nil || !strings.Contains(err.Error(), "pods.admission.tessera.dev") {
		t.Errorf("a labelled pod was not refused while the webhook is down: %v", err)
	}
	delete(pod.Labels, "tessera.dev/queue")
	if _, err := admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("an unlabelled pod was refused: %v", err)
	}

	// Upgrade to a changed value: the DaemonSet follows, the Secret the
	// controller owns keeps its data.
	secret, err := admin.CoreV1().Secrets(DefaultNamespace).Get(ctx, "tessera-webhook-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secret.Data = map[string][]byte{"ca.crt": []byte("controller-written")}
	if _, err := admin.CoreV1().Secrets(DefaultNamespace).Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if out, err := runHelm(t, append(install, "--set", "kubeletPlugin.timeSlices=4")...); err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	ds2, err := admin.AppsV1().DaemonSets(DefaultNamespace).Get(ctx, pluginName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ds2.Generation == ds.Generation || !strings.Contains(strings.Join(ds2.Spec.Template.Spec.Containers[0].Args, " "), "--time-slices=4") {
		t.Errorf("upgrade did not change the DaemonSet: %v", ds2.Spec.Template.Spec.Containers[0].Args)
	}
	secret, err = admin.CoreV1().Secrets(DefaultNamespace).Get(ctx, "tessera-webhook-tls", metav1.GetOptions{})
	if err != nil || string(secret.Data["ca.crt"]) != "controller-written" {
		t.Errorf("helm upgrade reset the webhook Secret the controller fills: %v %v", secret.Data, err)
	}

	// Uninstall leaves no cluster-scoped object behind (the CRD stays, as
	// Helm never deletes crds/).
	if out, err := runHelm(t, "uninstall", ReleaseName, "--kubeconfig", s.kubeconfig, "--namespace", DefaultNamespace, "--wait", "--timeout", "1m"); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, vapName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("policy left after uninstall: %v", err)
	}
	if _, err := admin.ResourceV1().DeviceClasses().Get(ctx, "gpu.tessera.dev", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("DeviceClass left after uninstall: %v", err)
	}
	if _, err := admin.RbacV1().ClusterRoles().Get(ctx, pluginName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ClusterRole left after uninstall: %v", err)
	}
}
