package helm

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/node/enforce"
	"github.com/tessera-dev/tessera/test/testutil"
)

// TestAdmissionPolicies installs the chart without its webhooks (so only
// the ValidatingAdmissionPolicies stand between a tenant and the API) into
// a real kube-apiserver, and acts as a namespace user with the built-in
// `edit` role, as the controller and as the kubelet plugin.
func TestAdmissionPolicies(t *testing.T) {
	s, ctx, admin := chartAPIServer(t)
	// The sandbox as the chart's defaults have it (the local cluster's
	// values tell it the nodes default to RuntimeDefault).
	install := s.installChart(t, "--set", "webhook.enabled=false", "--set", "controller.canary.enabled=true",
		"--set", "admissionPolicies.sandbox.nodesSeccompDefault=false",
		"--set-json", `admissionPolicies.extendedResourceNames=["example.com/gpu"]`)

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

	// Pods in Tessera's sandbox (policy <release>-sandbox) name a seccomp
	// profile; testSandbox tries the rest.
	pod := func(name string, labels map[string]string, gated, claim bool, env ...corev1.EnvVar) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox", Env: env}},
				SecurityContext: runtimeDefault()},
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
	refused("controller sets another condition", patch(ctl, "team-a", "w", `{"status":{"conditions":[{"type":"Ready","status":"True"}]}}`, "status"), "only its own tessera.dev/ conditions")
	allowed("controller marks a pod it evicts (DisruptionTarget) and idle", patch(ctl, "team-a", "w", `{"status":{"conditions":[{"type":"DisruptionTarget","status":"True","reason":"TesseraStalePin"},{"type":"tessera.dev/Idle","status":"False","reason":"Active"}]}}`, "status"))
	// The pin: node affinity on metadata.name and nothing else.
	refused("controller pins by a label", patch(ctl, "team-a", "w", `{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"gpu","operator":"In","values":["fast"]}]}]}}}}}`), "beyond pinning it to one node")
	allowed("controller sets its condition", patch(ctl, "team-a", "w", `{"status":{"conditions":[{"type":"tessera.dev/Admission","status":"False","reason":"Waiting","message":"queue default"}]}}`, "status"))
	allowed("controller admits (gate, pin by node name, annotations)", patch(ctl, "team-a", "w",
		`{"metadata":{"annotations":{"tessera.dev/admitted-at":"2026-01-01T00:00:00Z","tessera.dev/simulated-node":"n1","tessera.dev/pinned-node":"n1"}},"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchFields":[{"key":"metadata.name","operator":"In","values":["n1"]}]}]}}},"schedulingGates":[{"$patch":"delete","name":"tessera.dev/admission"}]}}`))

	// 1c. Canary queues: the canary controller's service account admits
	// as the controller's does, under the same limits; any other (here
	// one with the controller's RBAC) does not.
	testCanaryAdmits(t, ctx, s, admin, tenant)

	// 1b. Only the controller writes tessera.dev/ annotations (its
	// decisions) and tessera.dev/ labels other than queue, gang, gang-size;
	// the kubelet's and the scheduler's writes pass.
	testTesseraKeys(t, ctx, s, admin, tenant, ctl)

	// 5. The pod's env cannot loosen its limits: every variable HAMi-core
	// reads (enforce.HAMiCoreEnv) but the allowed ones, as a value or from
	// a ConfigMap or Secret key, and Tessera's own.
	envs := []corev1.EnvVar{{Name: "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", Value: "0=80G"}, {Name: "TESSERA_ENFORCEMENT", Value: "none"}}
	for _, name := range enforce.HAMiCoreEnv {
		name = strings.ReplaceAll(name, "<i>", "0")
		if slices.Contains(enforce.HAMiCoreEnvAllowed, name) {
			_, err := tenant.CoreV1().Pods("team-a").Create(ctx, pod("env", nil, false, true, corev1.EnvVar{Name: name, Value: "1"}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			allowed("claim user sets "+name+" (allowed: docs/enforcement.md)", err)
			continue
		}
		envs = append(envs, corev1.EnvVar{Name: name, Value: "1"},
			corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "k"}}})
	}
	for _, e := range envs {
		_, err := tenant.CoreV1().Pods("team-a").Create(ctx, pod("env", nil, false, true, e), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		refused(fmt.Sprintf("claim user sets %s (from a key: %v)", e.Name, e.ValueFrom != nil), err, "container main gets devices through DRA and sets a variable the GPU enforcement reads")
	}
	for _, prefix := range []string{"CUDA_RED", "ACTIVE_", "RECORD_KERNEL_", "GPU_", "CUDA_TASK", "CUDA_DEVICE_SM_LIMIT_"} {
		p := pod("envfrom", nil, false, true)
		p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{Prefix: prefix, SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}}}}
		_, err := tenant.CoreV1().Pods("team-a").Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		refused("claim user's envFrom prefix "+prefix, err, "envFrom prefix")
	}
	for _, prefix := range []string{"LIBCUDA_", "APP_", "CUDA_DEVICE_ORDER"} {
		p := pod("envfrom", nil, false, true)
		p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{Prefix: prefix, SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}}}}
		_, err := tenant.CoreV1().Pods("team-a").Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		allowed("claim user's envFrom prefix "+prefix, err)
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

	// 3 and 5 hold for devices asked through extended resources: the
	// implicit name of any class, and the names admissionPolicies lists.
	extended := func(name string, labels map[string]string, gated bool, res string, env ...corev1.EnvVar) *corev1.Pod {
		p := pod(name, labels, gated, false, env...)
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(res): resource.MustParse("1")}
		return p
	}
	for _, res := range []string{"deviceclass.resource.kubernetes.io/gpu.tessera.dev", "deviceclass.resource.kubernetes.io/any-class", "example.com/gpu"} {
		_, err = tenantM.CoreV1().Pods("managed").Create(ctx, extended("x", nil, false, res), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		refused(res+" without queue in a managed namespace", err, "a pod that gets devices through DRA (a ResourceClaim, or an extended resource a DeviceClass serves) goes through a queue")
		_, err = tenantM.CoreV1().Pods("managed").Create(ctx, extended("x", queued, false, res), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		refused(res+" without gate in a managed namespace", err, "waits for admission")
		_, err = tenantM.CoreV1().Pods("managed").Create(ctx, extended("x", queued, true, res), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		allowed(res+", queued and gated, in a managed namespace", err)
		_, err = tenant.CoreV1().Pods("team-a").Create(ctx, extended("x", nil, false, res, corev1.EnvVar{Name: "CUDA_DEVICE_MEMORY_LIMIT_0", Value: "80g"}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		refused(res+" user sets CUDA_DEVICE_MEMORY_LIMIT_0", err, "container main gets devices through DRA and sets a variable")
	}
	_, err = tenantM.CoreV1().Pods("managed").Create(ctx, extended("x", nil, false, "example.com/fpga"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	allowed("a device plugin's resource (no class the policies know) in a managed namespace", err)

	// 5d. NVIDIA_VISIBLE_DEVICES outside a claim (legacy NVIDIA runtime).
	testNvidiaVisibleDevices(t, ctx, admin, tenant)

	// 10. The sandbox: no privileged pods, host namespaces, hostPath,
	// added capabilities or unconfined seccomp for device users and in
	// managed namespaces.
	testSandbox(t, ctx, admin, tenant, tenantM)

	// 8b. Reclaim deletes only queued pods it marked Reclaimed.
	testControllerDeletes(t, ctx, admin, ctl)

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

	// The NVIDIA_VISIBLE_DEVICES policy is a value: off, the same pod passes.
	off := append(append([]string(nil), install...), "--set", "admissionPolicies.nvidiaVisibleDevices.enabled=false")
	if out, err := runHelm(t, off...); err != nil {
		t.Fatalf("helm upgrade with admissionPolicies.nvidiaVisibleDevices.enabled=false: %v\n%s", err, out)
	}
	testutil.Eventually(t, 60*time.Second, "NVIDIA_VISIBLE_DEVICES=all allowed once the policy is off", func() error {
		_, err := tenant.CoreV1().Pods("team-a").Create(ctx, nvidiaPod("off", corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})

	// Nodes that default to RuntimeDefault (sandbox.nodesSeccompDefault):
	// a claim pod without a profile passes, Unconfined still does not.
	nodesDefault := append(append([]string(nil), off...), "--set", "admissionPolicies.sandbox.nodesSeccompDefault=true")
	if out, err := runHelm(t, nodesDefault...); err != nil {
		t.Fatalf("helm upgrade with admissionPolicies.sandbox.nodesSeccompDefault=true: %v\n%s", err, out)
	}
	noProfile := sandboxPod("no-profile")
	noProfile.Spec.SecurityContext = nil
	testutil.Eventually(t, 60*time.Second, "a claim pod without a seccomp profile allowed once the nodes default to RuntimeDefault", func() error {
		_, err := tenant.CoreV1().Pods("team-a").Create(ctx, noProfile.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})
	unconfined := sandboxPod("unconfined")
	unconfined.Spec.SecurityContext.SeccompProfile.Type = corev1.SeccompProfileTypeUnconfined
	_, err = tenant.CoreV1().Pods("team-a").Create(ctx, unconfined, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	refused("a claim pod with seccomp Unconfined, nodes defaulting to RuntimeDefault", err, "runs with seccomp Unconfined")
}

// testTesseraKeys: policy <release>-pod-tessera-keys. Nobody but the
// controller's service account sets, changes or removes a tessera.dev/
// annotation, or a tessera.dev/ label other than queue, gang, gang-size;
// the kubelet's status updates and the scheduler's bindings pass.
func testTesseraKeys(t *testing.T, ctx context.Context, s *apiServer, admin, tenant, ctl kubernetes.Interface) {
	t.Helper()
	pods := tenant.CoreV1().Pods("team-a")
	meta := func(name string, labels, annotations map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}, SecurityContext: runtimeDefault()},
		}
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	// The policy is new in this install: wait until it is loaded.
	testutil.Eventually(t, 60*time.Second, "policy pod-tessera-keys loaded", func() error {
		_, err := pods.Create(ctx, meta("probe", nil, map[string]string{"tessera.dev/admission-decision": "x/1"}), dry)
		if err != nil && strings.Contains(err.Error(), "only Tessera's controller writes tessera.dev/ annotations") {
			return nil
		}
		return fmt.Errorf("forged decision annotation at creation: %v", err)
	})
	queued := map[string]string{"tessera.dev/queue": "default"}
	for _, tc := range []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		want        string // "" = allowed
	}{
		{"forged decision annotation", queued, map[string]string{"tessera.dev/admission-decision": "forged/1"}, "annotation tessera.dev/admission-decision cannot be set, changed or removed: only Tessera's controller"},
		{"forged pinned node", queued, map[string]string{"tessera.dev/simulated-node": "n1"}, "annotation tessera.dev/simulated-node cannot be set"},
		{"forged admission time (reclaim order)", queued, map[string]string{"tessera.dev/admitted-at": "2000-01-01T00:00:00Z"}, "annotation tessera.dev/admitted-at cannot be set"},
		{"an annotation no code reads yet", nil, map[string]string{"tessera.dev/anything": "1"}, "annotation tessera.dev/anything cannot be set"},
		{"unknown tessera.dev label", map[string]string{"tessera.dev/queue": "default", "tessera.dev/priority": "high"}, nil, "label tessera.dev/priority cannot be set, changed or removed: the tessera.dev/ labels a pod may carry are tessera.dev/queue, tessera.dev/gang and tessera.dev/gang-size"},
		{"queue label", queued, nil, ""},
		{"queue, gang and gang-size labels", map[string]string{"tessera.dev/queue": "default", "tessera.dev/gang": "g", "tessera.dev/gang-size": "2"}, nil, ""},
		{"another domain's annotation", nil, map[string]string{"demo.tessera.dev/expect": "Running", "example.com/tessera.dev": "1"}, ""},
	} {
		_, err := pods.Create(ctx, meta("k", tc.labels, tc.annotations), dry)
		if tc.want == "" {
			if err != nil {
				t.Errorf("tenant creates a pod with %s: %v, want allowed", tc.name, err)
			}
		} else if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("tenant creates a pod with %s: %v, want refused with %q", tc.name, err, tc.want)
		}
	}

	// On update: a pod the controller has decided for.
	if _, err := pods.Create(ctx, meta("keys", queued, map[string]string{"note": "mine"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	patch := func(c kubernetes.Interface, p string, sub ...string) error {
		_, err := c.CoreV1().Pods("team-a").Patch(ctx, "keys", types.StrategicMergePatchType, []byte(p), metav1.PatchOptions{}, sub...)
		return err
	}
	if err := patch(ctl, `{"metadata":{"annotations":{"tessera.dev/admission-decision":"d1/1","tessera.dev/simulated-node":"n1"}}}`); err != nil {
		t.Errorf("the controller records a decision in annotations: %v, want allowed", err)
	}
	for _, tc := range []struct {
		name, patch, want string
		sub               []string
	}{
		{name: "tenant adds a decision annotation by update", patch: `{"metadata":{"annotations":{"tessera.dev/admitted-at":"2000-01-01T00:00:00Z"}}}`, want: "annotation tessera.dev/admitted-at cannot be set, changed or removed"},
		{name: "tenant changes the controller's annotation", patch: `{"metadata":{"annotations":{"tessera.dev/simulated-node":"n2"}}}`, want: "annotation tessera.dev/simulated-node cannot be set"},
		{name: "tenant removes the controller's annotation", patch: `{"metadata":{"annotations":{"tessera.dev/admission-decision":null}}}`, want: "annotation tessera.dev/admission-decision cannot be set"},
		{name: "tenant adds an unknown tessera.dev label", patch: `{"metadata":{"labels":{"tessera.dev/evict-last":"true"}}}`, want: "label tessera.dev/evict-last cannot be set"},
		{name: "tenant changes its own annotation and label", patch: `{"metadata":{"annotations":{"note":"changed"},"labels":{"app":"y"}}}`},
		{name: "tenant exempts its pod from idle reclaim", patch: `{"metadata":{"labels":{"tessera.dev/idle-exempt":"true"}}}`, want: "label tessera.dev/idle-exempt cannot be set"},
	} {
		err := patch(tenant, tc.patch, tc.sub...)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v, want allowed", tc.name, err)
			}
		} else if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want refused with %q", tc.name, err, tc.want)
		}
	}
	// A cluster administrator (system:masters) may exempt a pod.
	if err := patch(admin, `{"metadata":{"labels":{"tessera.dev/idle-exempt":"true"}}}`); err != nil {
		t.Errorf("a cluster administrator exempts a pod from idle reclaim: %v, want allowed", err)
	}
	got, err := admin.CoreV1().Pods("team-a").Get(ctx, "keys", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Annotations["tessera.dev/admission-decision"] != "d1/1" || got.Annotations["tessera.dev/simulated-node"] != "n1" {
		t.Errorf("the controller's annotations after the tenant's attempts: %v", got.Annotations)
	}

	refusedMsg := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want refused with %q", what, err, want)
		}
	}
	// The scheduler binds the pod (pods/binding); a Binding's annotations
	// are copied onto the pod, so a tessera.dev/ one is refused there too.
	scheduler := s.as(t, "system:kube-scheduler", "system:authenticated")
	bind := func(annotations map[string]string) error {
		return scheduler.CoreV1().Pods("team-a").Bind(ctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: "keys", Annotations: annotations},
			Target:     corev1.ObjectReference{Kind: "Node", Name: "n1"},
		}, metav1.CreateOptions{})
	}
	refusedMsg("a Binding that carries a tessera.dev/ annotation", bind(map[string]string{"tessera.dev/simulated-node": "n1"}), "annotation tessera.dev/simulated-node cannot be set")
	if err := bind(nil); err != nil {
		t.Errorf("the scheduler binds a pod: %v, want allowed", err)
	}

	// The kubelet of the pod's node (system:node ClusterRole, as the Node
	// authorizer would allow) updates the status of a pod that carries the
	// controller's annotations; metadata unchanged, so it passes.
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubelet-like"},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "system:node:n1"}},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:node"},
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubelet := s.as(t, "system:node:n1", "system:nodes", "system:authenticated")
	if got, err = admin.CoreV1().Pods("team-a").Get(ctx, "keys", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != "n1" {
		t.Fatalf("pod keys is bound to %q, want n1", got.Spec.NodeName)
	}
	got.Status.Phase = corev1.PodRunning
	got.Status.Conditions = append(got.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
	// (RBAC picks up the new binding within moments.)
	testutil.Eventually(t, 60*time.Second, "kubelet-like pods/status update of a pod with the controller's annotations", func() error {
		_, err := kubelet.CoreV1().Pods("team-a").UpdateStatus(ctx, got.DeepCopy(), metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})
	err = patch(kubelet, `{"status":{"conditions":[{"type":"ContainersReady","status":"True"}]}}`, "status")
	if err != nil {
		t.Errorf("kubelet-like pods/status patch: %v, want allowed", err)
	}
	refusedMsg("a status writer changes a tessera.dev/ annotation through pods/status",
		patch(kubelet, `{"metadata":{"annotations":{"tessera.dev/admitted-at":"2000-01-01T00:00:00Z"}}}`, "status"), "annotation tessera.dev/admitted-at cannot be set")
}

// testCanaryAdmits: with controller.canary.enabled the policies admit exactly two
// service accounts, the controller's and the canary's: the canary ungates
// and writes tessera.dev/ annotations under the controller's limits
// (policy 8), and a third account with the same RBAC is refused both.
func testCanaryAdmits(t *testing.T, ctx context.Context, s *apiServer, admin, tenant kubernetes.Interface) {
	t.Helper()
	canary := s.impersonate(t, DefaultNamespace, controllerName+"-canary", "")
	if _, err := admin.CoreV1().ServiceAccounts(DefaultNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "intruder"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "intruder-as-controller"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "intruder", Namespace: DefaultNamespace}},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: controllerName},
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	intruder := s.impersonate(t, DefaultNamespace, "intruder", "")
	for _, name := range []string{"canary-w", "intruder-w"} {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"tessera.dev/queue": "default"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}, SecurityContext: runtimeDefault(),
				SchedulingGates: []corev1.PodSchedulingGate{{Name: "tessera.dev/admission"}}},
		}
		if _, err := tenant.CoreV1().Pods("team-a").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	patch := func(c kubernetes.Interface, name, p string, sub ...string) error {
		_, err := c.CoreV1().Pods("team-a").Patch(ctx, name, types.StrategicMergePatchType, []byte(p), metav1.PatchOptions{}, sub...)
		return err
	}
	admit := `{"metadata":{"annotations":{"tessera.dev/admitted-at":"2026-01-01T00:00:00Z","tessera.dev/admitted-by":"canary"}},"spec":{"schedulingGates":[{"$patch":"delete","name":"tessera.dev/admission"}]}}`
	cond := `{"status":{"conditions":[{"type":"tessera.dev/Admission","status":"True","reason":"Admitted","message":"queue default"}]}}`
	if err := patch(intruder, "intruder-w", `{"spec":{"schedulingGates":[{"$patch":"delete","name":"tessera.dev/admission"}]}}`); err == nil || !strings.Contains(err.Error(), "only Tessera's controller removes") {
		t.Errorf("a third service account with the controller's RBAC ungates: %v, want refused by the gate policy", err)
	}
	if err := patch(intruder, "intruder-w", `{"metadata":{"annotations":{"tessera.dev/admitted-by":"x"}}}`); err == nil || !strings.Contains(err.Error(), "only Tessera's") {
		t.Errorf("a third service account writes a tessera.dev/ annotation: %v, want refused", err)
	}
	if err := patch(canary, "canary-w", `{"metadata":{"labels":{"evil":"1"}}}`); err == nil || !strings.Contains(err.Error(), "may not change a pod's labels") {
		t.Errorf("the canary changes a label: %v, want refused as the controller is", err)
	}
	if err := patch(canary, "canary-w", cond, "status"); err != nil {
		t.Errorf("the canary sets its admission condition: %v", err)
	}
	if err := patch(canary, "canary-w", admit); err != nil {
		t.Errorf("the canary admits (gate, annotations): %v", err)
	}
}
