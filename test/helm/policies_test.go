package helm

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// TestAdmissionPolicies installs the chart without its webhooks (so only
// the ValidatingAdmissionPolicies stand between a tenant and the API) into
// a real kube-apiserver, and acts as a namespace user with the built-in
// `edit` role, as the controller and as the kubelet plugin.
func TestAdmissionPolicies(t *testing.T) {
	s, ctx, admin := chartAPIServer(t)
	install := []string{"upgrade", "--install", ReleaseName, ChartPath,
		"--kubeconfig", s.kubeconfig, "--namespace", DefaultNamespace, "--create-namespace",
		"--values", LocalClusterValues,
		"--set-string", "kubeletPlugin.mock.deviceRoot=/var/lib/tessera-helm-test/mock-devices",
		"--set", "webhook.enabled=false", "--timeout", "2m"}
	if out, err := runHelm(t, install...); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}

	// A tenant: a ServiceAccount with what `edit` gives on pods and claims
	// in its namespace (the built-in `edit` is an aggregated role, and no
	// kube-controller-manager aggregates it here; the e2e's tenant has the
	// real one); and a managed namespace.
	editLike := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant-edit"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "pods/attach", "pods/exec", "pods/eviction"}, Verbs: []string{"create", "delete", "deletecollection", "patch", "update", "get", "list", "watch"}},
			{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims", "resourceclaimtemplates"}, Verbs: []string{"create", "delete", "deletecollection", "patch", "update", "get", "list", "watch"}},
		},
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, editLike, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "managed", Labels: map[string]string{"tessera.dev/queue": "default"}}},
	} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, sa := range []string{"default", "tenant"} {
			if _, err := admin.CoreV1().ServiceAccounts(ns.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "tenant-edit"},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "tenant", Namespace: ns.Name}},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "tenant-edit"},
		}
		if _, err := admin.RbacV1().RoleBindings(ns.Name).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	tenant := s.impersonate(t, "team-a", "tenant", "")
	tenantM := s.impersonate(t, "managed", "tenant", "")
	ctl := s.impersonate(t, DefaultNamespace, controllerName, "")

	pod := func(name string, labels map[string]string, gated, claim bool, env ...corev1.EnvVar) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox", Env: env}}},
		}
		if gated {
			p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "tessera.dev/admission"}}
		}
		if claim {
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu")}}
			p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
		}
		return p
	}
	queued := map[string]string{"tessera.dev/queue": "default"}

	// The API server loads new policies within a few seconds.
	for deadline := time.Now().Add(60 * time.Second); ; {
		_, err := tenant.CoreV1().Pods("team-a").Create(ctx, pod("probe", nil, false, true, corev1.EnvVar{Name: "TESSERA_X", Value: "1"}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), "enforcement reads") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the admission policies are not enforced 60s after install: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	refused := func(what string, err error, want string) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: allowed, want refused", what)
		} else if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v (want a refusal naming %q)", what, err, want)
		}
	}
	allowed := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v, want allowed", what, err)
		}
	}
	patch := func(c kubernetes.Interface, ns, name, p string, sub ...string) error {
		_, err := c.CoreV1().Pods(ns).Patch(ctx, name, types.StrategicMergePatchType, []byte(p), metav1.PatchOptions{}, sub...)
		return err
	}

	// 1. Only the controller ungates; queue and gang labels are fixed.
	_, err := tenant.CoreV1().Pods("team-a").Create(ctx, pod("w", queued, true, true), metav1.CreateOptions{})
	allowed("tenant creates a queued, gated pod", err)
	ungate := `{"spec":{"schedulingGates":[{"$patch":"delete","name":"tessera.dev/admission"}]}}`
	refused("tenant removes the admission gate", patch(tenant, "team-a", "w", ungate), "only Tessera's controller removes the tessera.dev/admission scheduling gate")
	p, err := tenant.CoreV1().Pods("team-a").Get(ctx, "w", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.SchedulingGates = nil
	_, err = tenant.CoreV1().Pods("team-a").Update(ctx, p, metav1.UpdateOptions{})
	refused("tenant removes the admission gate with an update", err, "only Tessera's controller")
	refused("tenant changes the queue label", patch(tenant, "team-a", "w", `{"metadata":{"labels":{"tessera.dev/queue":"other"}}}`), "label tessera.dev/queue cannot change once the pod exists")
	refused("tenant removes the queue label", patch(tenant, "team-a", "w", `{"metadata":{"labels":{"tessera.dev/queue":null}}}`), "label tessera.dev/queue cannot change")
	refused("tenant adds gang labels", patch(tenant, "team-a", "w", `{"metadata":{"labels":{"tessera.dev/gang":"g","tessera.dev/gang-size":"1"}}}`), "label tessera.dev/gang, tessera.dev/gang-size cannot change")
	allowed("tenant sets its own label", patch(tenant, "team-a", "w", `{"metadata":{"labels":{"app":"x"}}}`))

	// 8. The controller changes only what admission writes.
	refused("controller adds a label", patch(ctl, "team-a", "w", `{"metadata":{"labels":{"evil":"1"}}}`), "may not change a pod's labels")
	refused("controller sets a foreign annotation", patch(ctl, "team-a", "w", `{"metadata":{"annotations":{"example.com/x":"1"}}}`), "only tessera.dev/ annotations")
	refused("controller adds a node selector", patch(ctl, "team-a", "w", `{"spec":{"nodeSelector":{"gpu":"fast"}}}`), "only the kubernetes.io/hostname node selector")
	refused("controller sets another condition", patch(ctl, "team-a", "w", `{"status":{"conditions":[{"type":"Ready","status":"True"}]}}`, "status"), "only its tessera.dev/Admission condition")
	allowed("controller sets its condition", patch(ctl, "team-a", "w", `{"status":{"conditions":[{"type":"tessera.dev/Admission","status":"False","reason":"Waiting","message":"queue default"}]}}`, "status"))
	allowed("controller admits (gate, hostname, annotations)", patch(ctl, "team-a", "w",
		`{"metadata":{"annotations":{"tessera.dev/admitted-at":"2026-01-01T00:00:00Z","tessera.dev/simulated-node":"n1"}},"spec":{"nodeSelector":{"kubernetes.io/hostname":"n1"},"schedulingGates":[{"$patch":"delete","name":"tessera.dev/admission"}]}}`))

	// 5. The pod's env cannot loosen its limits.
	for _, e := range []corev1.EnvVar{
		{Name: "CUDA_DEVICE_MEMORY_LIMIT_0", Value: "80g"}, {Name: "CUDA_DEVICE_SM_LIMIT", Value: "100"},
		{Name: "CUDA_DEVICE_MEMORY_SHARED_CACHE", Value: "/tmp/x"}, {Name: "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", Value: "0=80G"},
		{Name: "GPU_CORE_UTILIZATION_POLICY", Value: "disable"}, {Name: "TESSERA_ENFORCEMENT", Value: "none"},
	} {
		_, err := tenant.CoreV1().Pods("team-a").Create(ctx, pod("env", nil, false, true, e), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		refused("claim user sets "+e.Name, err, "container main uses a ResourceClaim and sets a variable the GPU enforcement reads")
	}
	withPrefix := pod("envfrom", nil, false, true)
	withPrefix.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{Prefix: "CUDA_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}}
	_, err = tenant.CoreV1().Pods("team-a").Create(ctx, withPrefix, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	refused("claim user's envFrom prefix CUDA_", err, "envFrom prefix")
	_, err = tenant.CoreV1().Pods("team-a").Create(ctx, pod("noclaim", nil, false, false, corev1.EnvVar{Name: "CUDA_MPS_PIPE_DIRECTORY", Value: "/x"}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	allowed("a pod without claims sets CUDA_MPS_PIPE_DIRECTORY", err)
	_, err = tenant.CoreV1().Pods("team-a").Create(ctx, pod("ok", nil, false, true, corev1.EnvVar{Name: "CUDA_VISIBLE_DEVICES_X", Value: "1"}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	allowed("claim user sets an unrelated variable", err)

	// 3. A managed namespace: nothing that uses a claim runs ungated (the
	// webhook that adds label and gate is off here: the policy refuses).
	_, err = tenantM.CoreV1().Pods("managed").Create(ctx, pod("m", nil, false, true), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	refused("claim user without queue in a managed namespace", err, "namespace managed is managed by queue default")
	_, err = tenantM.CoreV1().Pods("managed").Create(ctx, pod("m", queued, false, true), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	refused("claim user without gate in a managed namespace", err, "waits for admission (scheduling gate tessera.dev/admission)")
	bound := pod("m", queued, false, true)
	bound.Spec.NodeName = "n1"
	_, err = tenantM.CoreV1().Pods("managed").Create(ctx, bound, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	refused("claim user bound to a node in a managed namespace", err, "cannot name a node")
	_, err = tenantM.CoreV1().Pods("managed").Create(ctx, pod("m", queued, true, true), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	allowed("queued, gated claim user in a managed namespace", err)
	_, err = tenantM.CoreV1().Pods("managed").Create(ctx, pod("m", nil, false, false), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	allowed("pod without claims in a managed namespace", err)

	// 8. The plugin writes the status only of claims allocated on its node.
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev"},
		}}}},
	}
	claim, err = admin.ResourceV1().ResourceClaims("team-a").Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: "gpu.tessera.dev", Pool: "node-a", Device: "gpu-0",
		}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{
			Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-a"},
		}}}}},
	}
	if claim, err = admin.ResourceV1().ResourceClaims("team-a").UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	withDevices := claim.DeepCopy()
	withDevices.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: "gpu.tessera.dev", Pool: "node-a", Device: "gpu-0"}}
	_, err = s.impersonate(t, DefaultNamespace, pluginName, "node-b").ResourceV1().ResourceClaims("team-a").UpdateStatus(ctx, withDevices.DeepCopy(), metav1.UpdateOptions{})
	if err == nil {
		t.Error("plugin on node-b writes the status of a claim allocated on node-a: allowed")
	} else {
		t.Logf("plugin on node-b writing node-a's claim status: %v", err)
	}
	_, err = s.impersonate(t, DefaultNamespace, pluginName, "node-a").ResourceV1().ResourceClaims("team-a").UpdateStatus(ctx, withDevices.DeepCopy(), metav1.UpdateOptions{})
	allowed("plugin on node-a writes its claim's status.devices", err)
	// On 1.36+ the API server's own authorization of status.devices
	// (resourceclaims/driver, associated-node) and status.allocation
	// (resourceclaims/binding) refuses node-b before admission runs; the
	// claimstatus policy is what holds on 1.34/1.35, where
	// resourceclaims/status is all or nothing. Its CEL compiled and
	// allowed node-a's write above.
}
