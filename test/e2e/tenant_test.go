//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-dev/tessera/test/localcluster"
)

// attack is one row of the tenant attack table (docs/security.md).
type attack struct {
	name, outcome string
	held          bool
}

// TestTenantAttacks acts as a namespace user with the built-in `edit` role
// (a ServiceAccount, through impersonation) on the real cluster with the
// chart's controller, webhook and admission policies, tries every escape
// named in docs/security.md and checks that each is refused or has no effect: the
// running container's limit still equals its allocation and the queue's
// charge is unchanged. It prints the table docs/security.md carries.
func TestTenantAttacks(t *testing.T) {
	usePlugin(t, defaultPlugin)
	ctx := t.Context()
	startController(t)
	ns, managed := newNamespace(t), newNamespace(t)
	admin := cluster.Client
	// The tenant's queue takes only its namespaces and holds one 1Gi share;
	// another team's queue takes only that team's.
	for _, n := range []string{ns, managed} {
		nsObj, err := admin.CoreV1().Namespaces().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nsObj.Labels["tenant"] = "a"
		if n == managed {
			nsObj.Labels["tessera.dev/queue"] = "tenant-a"
		}
		if _, err := admin.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	queues := `apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: tenant-a}
spec:
  namespaceSelector: {matchLabels: {tenant: a}}
  resources:
    gpu.tessera.dev/memory: {quota: 1Gi, limit: 1Gi}
---
apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: team-other}
spec:
  namespaceSelector: {matchLabels: {team: other}}
  resources:
    gpu.tessera.dev/memory: {quota: 8Gi, limit: 8Gi}
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: floor.tessera.dev}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == "gpu"'}
  config:
  - opaque:
      driver: gpu.tessera.dev
      parameters: {apiVersion: tessera.dev/v1alpha1, kind: GpuConfig, minEnforcement: interposer}
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: nic.example.com}
spec:
  selectors:
  - cel: {expression: 'device.driver == "nic.example.com"'}
`
	applyYAML(t, queues)

	tenant := map[string]kubernetes.Interface{}
	for _, n := range []string{ns, managed} {
		tenant[n] = editClient(t, n)
	}
	interposer := `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","enforcement":"interposer"}`
	for _, n := range []string{ns, managed} {
		for _, tpl := range []*resourceapi.ResourceClaimTemplate{shareTemplate("gpu", "1Gi", interposer), shareTemplate("gpu2", "1Gi", interposer)} {
			if _, err := tenant[n].ResourceV1().ResourceClaimTemplates(n).Create(ctx, tpl, metav1.CreateOptions{}); err != nil {
				t.Fatalf("tenant creates template %s: %v", tpl.Name, err)
			}
		}
	}
	nic := shareTemplate("nic", "1Gi", "")
	nic.Spec.Spec.Devices.Requests[0].Exactly = &resourceapi.ExactDeviceRequest{DeviceClassName: "nic.example.com"}
	floor := shareTemplate("below-floor", "1Gi", `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","enforcement":"none"}`)
	floor.Spec.Spec.Devices.Requests[0].Exactly.DeviceClassName = "floor.tessera.dev"
	for _, tpl := range []*resourceapi.ResourceClaimTemplate{nic, floor} {
		if _, err := tenant[ns].ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tpl, metav1.CreateOptions{}); err != nil {
			t.Fatalf("tenant creates template %s: %v", tpl.Name, err)
		}
	}
	// claimPod's container prints its GPU variables; the tenant's also
	// prints GPU_CORE_UTILIZATION_POLICY.
	claimPod := func(name, template string) *corev1.Pod {
		p := claimPod(name, template)
		p.Spec.Containers[0].Command = []string{"sh", "-c", "env | grep -E 'TESSERA|CUDA|NVIDIA|GPU_' | sort; exec sleep 3600"}
		return p
	}
	queued := func(p *corev1.Pod, q string) *corev1.Pod {
		p.Labels = map[string]string{"tessera.dev/queue": q}
		return p
	}

	// The tenant's first pod is admitted and runs within its queue; the
	// second waits (the queue's limit is one share).
	c := tenant[ns].CoreV1().Pods(ns)
	if _, err := c.Create(ctx, queued(claimPod("running", "gpu"), "tenant-a"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("tenant creates its pod: %v", err)
	}
	waitPodPhase(t, ns, "running", corev1.PodRunning, 2*time.Minute)
	if _, err := c.Create(ctx, queued(claimPod("waiting", "gpu"), "tenant-a"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("tenant creates its second pod: %v", err)
	}
	charge := func() string {
		out, err := cluster.Kubectl(ctx, "get", "queue", "tenant-a", "-o", `jsonpath={.status.allocated.gpu\.tessera\.dev/memory}`)
		if err != nil {
			t.Fatalf("reading queue tenant-a: %v: %s", err, out)
		}
		return strings.TrimSpace(out)
	}
	waitFor(t, time.Minute, "queue tenant-a charged 1Gi, pod waiting gated", func(ctx context.Context) (bool, error) {
		p, err := admin.CoreV1().Pods(ns).Get(ctx, "waiting", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return charge() == "1Gi" && gated(p) && admissionMessage(p) != "", nil
	})
	before := charge()

	var rows []attack
	row := func(name string, held bool, outcome string, args ...any) {
		rows = append(rows, attack{name: name, held: held, outcome: fmt.Sprintf(outcome, args...)})
		if !held {
			t.Errorf("attack %q succeeded: %s", name, fmt.Sprintf(outcome, args...))
		}
	}
	refusal := func(err error, want string) (bool, string) {
		if err == nil {
			return false, "allowed"
		}
		msg := err.Error()
		if i := strings.Index(msg, "denied request: "); i >= 0 {
			msg = msg[i+len("denied request: "):]
		}
		return strings.Contains(err.Error(), want), "refused: " + msg
	}
	patch := func(name, p string) error {
		_, err := c.Patch(ctx, name, types.StrategicMergePatchType, []byte(p), metav1.PatchOptions{})
		return err
	}

	held, out := refusal(patch("waiting", `{"spec":{"schedulingGates":[{"$patch":"delete","name":"tessera.dev/admission"}]}}`), "only Tessera's controller")
	row("remove the tessera.dev/admission gate from a waiting pod", held, "%s", out)
	held, out = refusal(patch("running", `{"metadata":{"labels":{"tessera.dev/queue":"default"}}}`), "cannot change once the pod exists")
	row("move a running pod to another queue (change tessera.dev/queue)", held, "%s", out)
	held, out = refusal(patch("running", `{"metadata":{"labels":{"tessera.dev/queue":null}}}`), "cannot change once the pod exists")
	row("drop a running pod's charge (remove tessera.dev/queue)", held, "%s", out)
	held, out = refusal(patch("waiting", `{"metadata":{"labels":{"tessera.dev/gang":"g","tessera.dev/gang-size":"1"}}}`), "cannot change once the pod exists")
	row("regroup a pod into a gang (add tessera.dev/gang)", held, "%s", out)
	_, err := c.Create(ctx, queued(claimPod("other-queue", "gpu"), "team-other"), metav1.CreateOptions{})
	held, out = refusal(err, "queue team-other takes pods only from namespaces matching its namespaceSelector")
	row("spend another team's quota (name queue team-other)", held, "%s", out)

	// A managed namespace: a claim user that names no queue goes through the namespace's.
	mc := tenant[managed].CoreV1().Pods(managed)
	p, err := mc.Create(ctx, claimPod("unlabelled", "gpu"), metav1.CreateOptions{})
	if err != nil {
		row("run a claim pod with no queue label (managed namespace)", false, "creating it failed: %v", err)
	} else {
		row("run a claim pod with no queue label (managed namespace)", p.Labels["tessera.dev/queue"] == "tenant-a" && gated(p),
			"created in queue %q, gated %v: waits for its queue", p.Labels["tessera.dev/queue"], gated(p))
	}
	bound := claimPod("bound", "gpu")
	bound.Spec.NodeName = localcluster.NodeName
	_, err = mc.Create(ctx, bound, metav1.CreateOptions{})
	held, out = refusal(err, "is managed by queue tenant-a")
	row("skip the queue by naming the node (managed namespace)", held, "%s", out)

	for _, e := range []corev1.EnvVar{{Name: "CUDA_DEVICE_MEMORY_LIMIT_0", Value: "81920m"}, {Name: "GPU_CORE_UTILIZATION_POLICY", Value: "disable"}} {
		p := claimPod("env", "gpu")
		p.Spec.Containers[0].Env = []corev1.EnvVar{e}
		_, err := c.Create(ctx, p, metav1.CreateOptions{})
		held, out := refusal(err, "sets a variable the GPU enforcement reads")
		row(fmt.Sprintf("loosen the limit from the pod's env (%s=%s)", e.Name, e.Value), held, "%s", out)
	}
	two := claimPod("two-claims", "gpu")
	two.Spec.ResourceClaims = append(two.Spec.ResourceClaims, corev1.PodResourceClaim{Name: "gpu2", ResourceClaimTemplateName: new("gpu2")})
	two.Spec.Containers[0].Resources.Claims = append(two.Spec.Containers[0].Resources.Claims, corev1.ResourceClaim{Name: "gpu2"})
	_, err = c.Create(ctx, two, metav1.CreateOptions{})
	held, out = refusal(err, "use one claim with several requests instead")
	row("one container with two Tessera claims (colliding limits)", held, "%s", out)
	withNIC := claimPod("gpu-and-nic", "gpu")
	withNIC.Spec.ResourceClaims = append(withNIC.Spec.ResourceClaims, corev1.PodResourceClaim{Name: "nic", ResourceClaimTemplateName: new("nic")})
	withNIC.Spec.Containers[0].Resources.Claims = append(withNIC.Spec.Containers[0].Resources.Claims, corev1.ResourceClaim{Name: "nic"})
	_, err = c.Create(ctx, withNIC, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Errorf("one Tessera claim and a NIC claim in one container was refused: %v", err)
	}

	// Below the class's floor: the claim asks enforcement none under a
	// class whose administrator set minEnforcement interposer.
	if _, err := c.Create(ctx, claimPod("below-floor", "below-floor"), metav1.CreateOptions{}); err != nil {
		row("claim asks enforcement: none under a class whose floor is interposer", false, "creating the pod failed: %v", err)
	} else {
		var msg string
		waitFor(t, 90*time.Second, "a warning event of pod below-floor naming the floor", func(ctx context.Context) (bool, error) {
			for _, e := range podEvents(ctx, ns, "below-floor") {
				if e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "interposer") {
					msg = e.Message
					return true, nil
				}
			}
			return false, nil
		})
		bp, err := admin.CoreV1().Pods(ns).Get(ctx, "below-floor", metav1.GetOptions{})
		started := err != nil || bp.Status.Phase != corev1.PodPending
		if i := strings.Index(msg, "minEnforcement"); i > 0 && len(msg) > 160 {
			msg = msg[max(0, i-80):]
		}
		row("claim asks enforcement: none under a class whose floor is interposer", !started, "prepare fails, pod stays Pending: %s", msg)
	}

	// No effect: the queue's charge and the running container's limit.
	after := charge()
	row("the queue's charge after every attack", after == before, "%s before, %s after", before, after)
	env := map[string]string{}
	for _, line := range strings.Split(podLogs(t, ns, "running"), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	row("the running container's limit", env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1024m" && env["GPU_CORE_UTILIZATION_POLICY"] == "force",
		"CUDA_DEVICE_MEMORY_LIMIT_0=%s (allocation 1Gi), GPU_CORE_UTILIZATION_POLICY=%s", env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["GPU_CORE_UTILIZATION_POLICY"])

	var sb strings.Builder
	tw := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTACK (as a tenant with edit)\tHELD\tOUTCOME")
	for _, r := range rows {
		o := r.outcome
		if len(o) > 160 {
			o = o[:157] + "..."
		}
		fmt.Fprintf(tw, "%s\t%v\t%s\n", r.name, r.held, o)
	}
	tw.Flush()
	t.Logf("tenant attacks:\n%s", sb.String())
	fmt.Println(sb.String())
}
