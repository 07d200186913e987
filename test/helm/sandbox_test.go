package helm

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/test/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

func runtimeDefault() *corev1.PodSecurityContext {
	return &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
}

// sandboxPod is a pod that uses a ResourceClaim, with the seccomp profile
// the sandbox asks for; the cases change it.
func sandboxPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			SecurityContext: runtimeDefault(),
			Containers:      []corev1.Container{{Name: "main", Image: "busybox", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu")}},
		},
	}
}

// testSandbox: policy <release>-sandbox, with the chart's defaults, as a
// tenant with edit: a pod that uses a claim (namespace team-a) or any pod
// of a managed namespace is refused what would reach the node's files or
// let it cover the claim's read-only /etc/ld.so.preload; other pods, the
// release's namespace, kube-system and a namespace an administrator
// labelled tessera.dev/sandbox=exempt are left alone.
func testSandbox(t *testing.T, ctx context.Context, admin, tenant, tenantM kubernetes.Interface) {
	t.Helper()
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	const where = "may hold Tessera's GPUs or runs in a namespace Tessera manages"
	testutil.Eventually(t, 60*time.Second, "policy sandbox loaded", func() error {
		p := sandboxPod("probe")
		p.Spec.HostNetwork = true
		_, err := tenant.CoreV1().Pods("team-a").Create(ctx, p, dry)
		if err != nil && strings.Contains(err.Error(), where) {
			return nil
		}
		return fmt.Errorf("hostNetwork claim pod: %v", err)
	})
	hostPath := func(path string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}}})
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "host", MountPath: "/host"}}
		}
	}
	container := func(f func(c *corev1.Container)) func(*corev1.Pod) {
		return func(p *corev1.Pod) { f(&p.Spec.Containers[0]) }
	}
	secCtx := func(sc *corev1.SecurityContext) func(*corev1.Pod) {
		return container(func(c *corev1.Container) { c.SecurityContext = sc })
	}
	podSeccomp := func(typ corev1.SeccompProfileType) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{}
			if typ != "" {
				p.Spec.SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: typ}
				if typ == corev1.SeccompProfileTypeLocalhost {
					p.Spec.SecurityContext.SeccompProfile.LocalhostProfile = ptr.To("profiles/gpu.json")
				}
			}
		}
	}
	noClaim := func(p *corev1.Pod) { p.Spec.ResourceClaims, p.Spec.Containers[0].Resources.Claims = nil, nil }
	both := func(fs ...func(*corev1.Pod)) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			for _, f := range fs {
				f(p)
			}
		}
	}
	for _, tc := range []struct {
		name   string
		client kubernetes.Interface
		ns     string
		pod    func(*corev1.Pod)
		want   string // "" = allowed
	}{
		{"a claim user under RuntimeDefault", tenant, "team-a", func(*corev1.Pod) {}, ""},
		{"a Localhost seccomp profile", tenant, "team-a", podSeccomp(corev1.SeccompProfileTypeLocalhost), ""},
		{"no seccomp profile", tenant, "team-a", podSeccomp(""), `container main has no seccomp profile`},
		{"seccomp Unconfined for the pod", tenant, "team-a", podSeccomp(corev1.SeccompProfileTypeUnconfined), "container main runs with seccomp Unconfined"},
		{"seccomp Unconfined for a container", tenant, "team-a", secCtx(&corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}), "seccomp Unconfined"},
		{"a container's RuntimeDefault under an Unconfined pod", tenant, "team-a", both(podSeccomp(corev1.SeccompProfileTypeUnconfined),
			secCtx(&corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}})), ""},
		{"privileged", tenant, "team-a", secCtx(&corev1.SecurityContext{Privileged: ptr.To(true)}), "container main is privileged"},
		{"a privileged init container", tenant, "team-a", func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}}
		}, "container init is privileged"},
		{"hostNetwork", tenant, "team-a", func(p *corev1.Pod) { p.Spec.HostNetwork = true }, "host's namespaces (hostNetwork)"},
		{"hostPID and hostIPC", tenant, "team-a", func(p *corev1.Pod) { p.Spec.HostPID, p.Spec.HostIPC = true, true }, "host's namespaces (hostPID, hostIPC)"},
		{"hostPath /var/run/cdi", tenant, "team-a", hostPath("/var/run/cdi"), "hostPath volumes (host (/var/run/cdi))"},
		{"hostPath /var/lib/kubelet/plugins/gpu.tessera.dev", tenant, "team-a", hostPath("/var/lib/kubelet/plugins/gpu.tessera.dev"), "hostPath volumes"},
		{"hostPath of an unrelated directory", tenant, "team-a", hostPath("/usr/lib"), "hostPath volumes (host (/usr/lib))"},
		{"SYS_ADMIN", tenant, "team-a", secCtx(&corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}}), "container main (SYS_ADMIN) adds capabilities beyond Pod Security baseline's"},
		{"CAP_SYS_ADMIN", tenant, "team-a", secCtx(&corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"CAP_SYS_ADMIN"}}}), "(CAP_SYS_ADMIN) adds capabilities"},
		{"NET_BIND_SERVICE (baseline allows it)", tenant, "team-a", secCtx(&corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE"}}}), ""},
		{"AppArmor Unconfined", tenant, "team-a", secCtx(&corev1.SecurityContext{AppArmorProfile: &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined}}), "runs AppArmor unconfined"},
		{"a queued pod without a claim, privileged", tenant, "team-a", both(noClaim, func(p *corev1.Pod) { p.Labels = map[string]string{"tessera.dev/queue": "default"} },
			secCtx(&corev1.SecurityContext{Privileged: ptr.To(true)})), "is privileged"},
		{"a DRA extended resource, hostNetwork", tenant, "team-a", both(noClaim, func(p *corev1.Pod) {
			p.Spec.HostNetwork = true
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"deviceclass.resource.kubernetes.io/gpu.tessera.dev": resource.MustParse("1")}
		}), "host's namespaces (hostNetwork)"},
		{"a pod without a claim outside managed namespaces (Pod Security's, not Tessera's)", tenant, "team-a", both(noClaim, hostPath("/var/run/cdi"), podSeccomp("")), ""},
		{"a managed namespace's pod without a claim, hostPath /var/run/cdi", tenantM, "managed", both(noClaim, hostPath("/var/run/cdi")), "hostPath volumes"},
		{"a managed namespace's pod without a claim, privileged", tenantM, "managed", both(noClaim, secCtx(&corev1.SecurityContext{Privileged: ptr.To(true)})), "is privileged"},
		{"a managed namespace's pod without a claim, no seccomp profile", tenantM, "managed", both(noClaim, podSeccomp("")), "has no seccomp profile"},
		{"a managed namespace's plain pod", tenantM, "managed", noClaim, ""},
	} {
		p := sandboxPod("sb")
		tc.pod(p)
		_, err := tc.client.CoreV1().Pods(tc.ns).Create(ctx, p, dry)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want allowed", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want refused with %q", tc.name, err, tc.want)
		case tc.want != "" && !strings.Contains(err.Error(), "tessera.dev/sandbox=exempt"):
			t.Errorf("%s: %v does not say how an administrator exempts a namespace", tc.name, err)
		}
	}

	// Ephemeral containers (kubectl debug) go through the same rules on
	// pods/ephemeralcontainers; the pod's own containers are not checked
	// again.
	p, err := admin.CoreV1().Pods("team-a").Create(ctx, sandboxPod("debug-sb"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		sc   *corev1.SecurityContext
		want string
	}{
		{"privileged", &corev1.SecurityContext{Privileged: ptr.To(true)}, "container debug is privileged"},
		{"seccomp Unconfined", &corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}, "container debug runs with seccomp Unconfined"},
		{"SYS_PTRACE", &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_PTRACE"}}}, "container debug (SYS_PTRACE)"},
		{"plain", nil, ""},
	} {
		q := p.DeepCopy()
		q.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "busybox", SecurityContext: tc.sc}}}
		_, err := admin.CoreV1().Pods("team-a").UpdateEphemeralContainers(ctx, "debug-sb", q, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("ephemeral container %s: %v, want allowed", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("ephemeral container %s: %v, want refused with %q", tc.name, err, tc.want)
		}
	}

	// Left out: the release's namespace, kube-system (exemptNamespaces)
	// and a namespace an administrator labelled tessera.dev/sandbox=exempt.
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "lab", Labels: map[string]string{"tessera.dev/sandbox": "exempt"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{DefaultNamespace, "kube-system", "lab"} {
		if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		p := sandboxPod("exempt")
		p.Spec.HostNetwork = true
		hostPath("/var/run/cdi")(p)
		p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		testutil.Eventually(t, 60*time.Second, "a privileged hostPath claim pod in namespace "+ns+" (left out)", func() error {
			_, err := admin.CoreV1().Pods(ns).Create(ctx, p.DeepCopy(), dry)
			return err
		})
	}
}

// testControllerDeletes: policy <controller>-pod-deletes. The controller
// may delete a pod (past a budget that refused its eviction) only when it
// is queued and carries the controller's Reclaimed condition.
func testControllerDeletes(t *testing.T, ctx context.Context, admin, ctl kubernetes.Interface) {
	t.Helper()
	dry := metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
	const want = "Tessera's controller may delete only queued pods (label tessera.dev/queue) it reclaims"
	mk := func(name string, labels map[string]string) {
		p := sandboxPod(name)
		p.Labels = labels
		if _, err := admin.CoreV1().Pods("team-a").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mk("victim", map[string]string{"tessera.dev/queue": "default"})
	mk("bystander", nil)
	testutil.Eventually(t, 60*time.Second, "policy pod-deletes loaded", func() error {
		err := ctl.CoreV1().Pods("team-a").Delete(ctx, "victim", dry)
		if err != nil && strings.Contains(err.Error(), want) {
			return nil
		}
		return fmt.Errorf("deleting a queued pod not marked Reclaimed: %v", err)
	})
	mark := `{"status":{"conditions":[{"type":"tessera.dev/Admission","status":"False","reason":"Reclaimed","message":"reclaimed"}]}}`
	for _, name := range []string{"victim", "bystander"} {
		if _, err := ctl.CoreV1().Pods("team-a").Patch(ctx, name, types.StrategicMergePatchType, []byte(mark), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatalf("the controller marks %s Reclaimed: %v", name, err)
		}
	}
	if err := ctl.CoreV1().Pods("team-a").Delete(ctx, "victim", dry); err != nil {
		t.Errorf("the controller deletes a queued pod it marked Reclaimed: %v, want allowed", err)
	}
	if err := ctl.CoreV1().Pods("team-a").Delete(ctx, "bystander", dry); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("the controller deletes a pod that is in no queue: %v, want refused with %q", err, want)
	}
}
