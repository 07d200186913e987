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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// implicitGPU is the extended resource the gpu.tessera.dev DeviceClass
// answers to in every 1.37 cluster (DRAExtendedResource, GA).
const implicitGPU = "deviceclass.resource.kubernetes.io/gpu.tessera.dev"

// TestEveryDoor acts as namespace users with the built-in `edit` role and
// asks for GPUs every way Kubernetes 1.37 accepts besides a pod's
// spec.resourceClaims: the implicit extended resource of Tessera's class,
// a DeviceClass's own extendedResourceName, both in a gang, next to a
// claim in one container; and against queues whose rules change between
// the pod's creation and its admission (a queue created later for other
// namespaces only, a namespaceSelector narrowed while the pod waits).
// Every row asserts that the pod got no GPU past its queue: refused, or
// gated with the reason, and the queue's charge unchanged.
func TestEveryDoor(t *testing.T) {
	usePlugin(t, defaultPlugin)
	ctx := t.Context()
	startController(t)
	admin := cluster.Client
	ns, managed := newNamespace(t), newNamespace(t)
	relabel := func(n string, kv map[string]string) {
		t.Helper()
		o, err := admin.CoreV1().Namespaces().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range kv {
			if v == "" {
				delete(o.Labels, k)
			} else {
				o.Labels[k] = v
			}
		}
		if _, err := admin.CoreV1().Namespaces().Update(ctx, o, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	relabel(ns, map[string]string{"doors": "a"})
	relabel(managed, map[string]string{"doors": "a", "tessera.dev/queue": "doors-small"})
	applyYAML(t, `apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: doors-small}
spec:
  namespaceSelector: {matchLabels: {doors: a}}
  resources:
    gpu.tessera.dev/memory: {quota: 1Gi, limit: 1Gi}
---
apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: doors-zero}
spec:
  namespaceSelector: {matchLabels: {doors: a}}
  resources:
    gpu.tessera.dev/memory: {quota: "0", limit: "0"}
---
apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: doors-big}
spec:
  namespaceSelector: {matchLabels: {doors: a}}
  resources:
    gpu.tessera.dev/memory: {quota: 64Gi, limit: 64Gi}
---
apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: doors-narrowed}
spec:
  namespaceSelector: {matchLabels: {doors: a}}
  resources:
    gpu.tessera.dev/memory: {quota: "0", limit: "0"}
---
# A class made outside the chart whose own extendedResourceName hands out
# Tessera's whole GPUs (what a platform that moved from the device plugin
# sets up).
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: doors-whole.example.com}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == "gpu"'}
  extendedResourceName: example.com/gpu
`)
	tenant, managedTenant := editClient(t, ns), editClient(t, managed)
	for _, c := range []struct {
		ns  string
		cli interface {
			Create(context.Context, *resourceapi.ResourceClaimTemplate, metav1.CreateOptions) (*resourceapi.ResourceClaimTemplate, error)
		}
	}{{ns, tenant.ResourceV1().ResourceClaimTemplates(ns)}, {managed, managedTenant.ResourceV1().ResourceClaimTemplates(managed)}} {
		if _, err := c.cli.Create(ctx, shareTemplate("gpu", "1Gi", ""), metav1.CreateOptions{}); err != nil {
			t.Fatalf("tenant creates a template in %s: %v", c.ns, err)
		}
	}
	var rows []attack
	row := func(name string, held bool, outcome string, args ...any) {
		rows = append(rows, attack{name: name, held: held, outcome: fmt.Sprintf(outcome, args...)})
		if !held {
			t.Errorf("attack %q succeeded: %s", name, fmt.Sprintf(outcome, args...))
		}
	}
	extPod := func(name, queue, res string, n int) *corev1.Pod {
		p := busyboxPod(name, "sh", "-c", "env | grep -E 'TESSERA|CUDA|NVIDIA' | sort; exec sleep 3600")
		q := resource.MustParse(fmt.Sprint(n))
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(res): q}
		if queue != "" {
			p.Labels = map[string]string{"tessera.dev/queue": queue}
		}
		return p
	}
	getPod := func(n, name string) *corev1.Pod {
		p, err := admin.CoreV1().Pods(n).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("reading pod %s/%s: %v", n, name, err)
		}
		return p
	}
	// reason waits until the pod's admission condition says something and
	// returns its reason and message.
	reason := func(n, name string) (string, string) {
		t.Helper()
		var r, m string
		waitFor(t, 90*time.Second, "a reason on pod "+name, func(ctx context.Context) (bool, error) {
			p := getPod(n, name)
			for _, c := range p.Status.Conditions {
				if c.Type == "tessera.dev/Admission" && c.Message != "" {
					r, m = c.Reason, c.Message
				}
			}
			return r != "" || !gated(p), nil
		})
		return r, m
	}
	charge := func(q string) string {
		out, err := cluster.Kubectl(ctx, "get", "queue", q, "-o", `jsonpath={.status.allocated.gpu\.tessera\.dev/memory}`)
		if err != nil {
			t.Fatalf("reading queue %s: %v: %s", q, err, out)
		}
		if s := strings.TrimSpace(out); s != "" {
			return s
		}
		return "0"
	}

	// The implicit extended resource, no queue label, in a managed
	// namespace: the webhook puts it in the namespace's queue and gates it.
	p, err := managedTenant.CoreV1().Pods(managed).Create(ctx, extPod("implicit-managed", "", implicitGPU, 1), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("tenant creates an extended-resource pod in a managed namespace: %v", err)
	}
	r, m := reason(managed, p.Name)
	row("a GPU through deviceclass.resource.kubernetes.io/gpu.tessera.dev, no queue label (managed namespace)",
		p.Labels["tessera.dev/queue"] == "doors-small" && gated(getPod(managed, p.Name)) && r == "QueueLimit",
		"queue %q, gated %v: %s %s", p.Labels["tessera.dev/queue"], gated(getPod(managed, p.Name)), r, m)

	// The same request in a queue whose limit is 0.
	if _, err := tenant.CoreV1().Pods(ns).Create(ctx, extPod("implicit-zero", "doors-zero", implicitGPU, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r, m = reason(ns, "implicit-zero")
	row("a GPU through the implicit extended resource in a queue whose limit is 0", gated(getPod(ns, "implicit-zero")) && r == "QueueLimit", "stays gated: %s %s", r, m)

	// A class's own extendedResourceName, in the managed namespace.
	if _, err := managedTenant.CoreV1().Pods(managed).Create(ctx, extPod("explicit-managed", "", "example.com/gpu", 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p = getPod(managed, "explicit-managed")
	r, m = reason(managed, p.Name)
	row("a GPU through a DeviceClass's extendedResourceName (example.com/gpu), no queue label (managed namespace)",
		p.Labels["tessera.dev/queue"] == "doors-small" && gated(p) && r == "QueueLimit", "queue %q, gated %v: %s %s", p.Labels["tessera.dev/queue"], gated(p), r, m)

	// A gang of three whole GPUs on a two-GPU node: none of it starts.
	for i := range 3 {
		g := extPod(fmt.Sprintf("gang-%d", i), "doors-big", implicitGPU, 1)
		g.Labels["tessera.dev/gang"], g.Labels["tessera.dev/gang-size"] = "ext", "3"
		if _, err := tenant.CoreV1().Pods(ns).Create(ctx, g, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	r, m = reason(ns, "gang-0")
	allGated := gated(getPod(ns, "gang-0")) && gated(getPod(ns, "gang-1")) && gated(getPod(ns, "gang-2"))
	row("a gang of 3 asking whole GPUs through extended resources on 2 GPUs", allGated && r == "DoesNotFit", "all gated %v: %s %s", allGated, r, m)
	for i := range 3 {
		_ = admin.CoreV1().Pods(ns).Delete(ctx, fmt.Sprintf("gang-%d", i), metav1.DeleteOptions{})
	}

	// A share claim and an extended resource in one container.
	both := claimPod("share-and-whole", "gpu")
	both.Labels = map[string]string{"tessera.dev/queue": "doors-big"}
	both.Spec.Containers[0].Resources.Limits = corev1.ResourceList{implicitGPU: resource.MustParse("1")}
	_, err = tenant.CoreV1().Pods(ns).Create(ctx, both, metav1.CreateOptions{})
	row("a 1Gi share claim and the whole-GPU extended resource in one container", err != nil && strings.Contains(err.Error(), "use one claim with several requests"), "%v", err)

	// Admitted through the implicit name: charged from the real allocation,
	// the container gets the GPU the scheduler's claim names.
	if _, err := tenant.CoreV1().Pods(ns).Create(ctx, extPod("implicit-big", "doors-big", implicitGPU, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	run := waitPodPhase(t, ns, "implicit-big", corev1.PodRunning, 2*time.Minute)
	got := charge("doors-big")
	logs := podLogs(t, ns, "implicit-big")
	row("a whole GPU through the implicit extended resource in a queue with room",
		run.Status.ExtendedResourceClaimStatus != nil && got != "0" && strings.Contains(logs, "NVIDIA_VISIBLE_DEVICES="),
		"runs with claim %v, queue charged %s, env %q", run.Status.ExtendedResourceClaimStatus != nil, got, strings.Join(strings.Fields(logs), " "))
	zero := int64(0)
	if err := tenant.CoreV1().Pods(ns).Delete(ctx, "implicit-big", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 90*time.Second, "queue doors-big released", func(ctx context.Context) (bool, error) { return charge("doors-big") == "0", nil })

	// A queue created after the pod that names it, for other namespaces.
	if _, err := tenant.CoreV1().Pods(ns).Create(ctx, queuedClaimPod("early", "doors-late"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("a pod naming a queue that does not exist yet: %v", err)
	}
	applyYAML(t, `apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: doors-late}
spec:
  namespaceSelector: {matchLabels: {doors: someone-else}}
`)
	waitFor(t, 90*time.Second, "pod early's reason to name the selector", func(ctx context.Context) (bool, error) {
		r, _ := reason(ns, "early")
		return r == "NamespaceNotSelected" || !gated(getPod(ns, "early")), nil
	})
	r, m = reason(ns, "early")
	row("name a queue before it exists; it is created for other namespaces only", gated(getPod(ns, "early")) && r == "NamespaceNotSelected", "stays gated: %s %s", r, m)

	// A selector narrowed while the pod waits, then room made: still gated.
	if _, err := tenant.CoreV1().Pods(ns).Create(ctx, queuedClaimPod("narrowed", "doors-narrowed"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if r, _ := reason(ns, "narrowed"); r != "QueueLimit" {
		t.Fatalf("pod narrowed waits for %q, want QueueLimit first", r)
	}
	if out, err := cluster.Kubectl(ctx, "patch", "queue", "doors-narrowed", "--type=merge", "-p",
		`{"spec":{"namespaceSelector":{"matchLabels":{"doors":"b"}},"resources":{"gpu.tessera.dev/memory":{"quota":"8Gi","limit":"8Gi"}}}}`); err != nil {
		t.Fatalf("narrowing doors-narrowed: %v: %s", err, out)
	}
	waitFor(t, 90*time.Second, "pod narrowed's reason to name the selector", func(ctx context.Context) (bool, error) {
		r, _ := reason(ns, "narrowed")
		return r == "NamespaceNotSelected" || !gated(getPod(ns, "narrowed")), nil
	})
	r, m = reason(ns, "narrowed")
	row("wait in a queue whose namespaceSelector is narrowed to another team (then given room)", gated(getPod(ns, "narrowed")) && r == "NamespaceNotSelected", "stays gated: %s %s", r, m)

	for _, q := range []string{"doors-small", "doors-zero", "doors-narrowed", "doors-late"} {
		row("queue "+q+"'s charge after every attempt", charge(q) == "0", "%s", charge(q))
	}

	var sb strings.Builder
	tw := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTEMPT (as a tenant with edit)\tHELD\tOUTCOME")
	for _, r := range rows {
		o := r.outcome
		if len(o) > 160 {
			o = o[:157] + "..."
		}
		fmt.Fprintf(tw, "%s\t%v\t%s\n", r.name, r.held, o)
	}
	tw.Flush()
	t.Logf("every door to a GPU:\n%s", sb.String())
	fmt.Println(sb.String())
}

// queuedClaimPod is claimPod (a 1Gi share from template gpu) in queue q.
func queuedClaimPod(name, q string) *corev1.Pod {
	p := claimPod(name, "gpu")
	p.Labels = map[string]string{"tessera.dev/queue": q}
	return p
}
