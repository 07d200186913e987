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
)

// TestHostileAdmission acts as namespace users with the built-in `edit`
// role against the controller's admission, one attack per class of
// docs/security.md's "Hostile and malformed input": forged controller
// state, one workload's bad claim stalling the others, charges that move or
// vanish, and the special cases (a namespace that has just become managed,
// NVIDIA_VISIBLE_DEVICES without a claim). Each row asserts the outcome:
// refused, or no effect on any queue's charge and no delay to another
// tenant's pod.
func TestHostileAdmission(t *testing.T) {
	inParallel(t)
	ctx := t.Context()
	admin := cluster.Client
	ns, other := newNamespace(t), newNamespace(t)
	label := func(n string, kv map[string]string) {
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
	label(ns, map[string]string{"hostile": "a"})
	label(other, map[string]string{"hostile": "b"})
	applyYAML(t, `apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: hostile-a}
spec:
  namespaceSelector: {matchLabels: {hostile: a}}
  resources:
    gpu.tessera.dev/memory: {quota: 2Gi, limit: 2Gi}
---
apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: hostile-zero}
spec:
  namespaceSelector: {matchLabels: {hostile: a}}
  resources:
    gpu.tessera.dev/memory: {quota: "0", limit: "0"}
---
apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: hostile-b}
spec:
  namespaceSelector: {matchLabels: {hostile: b}}
  resources:
    gpu.tessera.dev/memory: {quota: 4Gi, limit: 4Gi}
`)
	tenant, neighbour := editClient(t, ns), editClient(t, other)
	for _, tpl := range []*resourceapi.ResourceClaimTemplate{shareTemplate("gpu", "1Gi", ""), shareTemplate("small", "256Mi", "")} {
		if _, err := tenant.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tpl, metav1.CreateOptions{}); err != nil {
			t.Fatalf("tenant creates template %s: %v", tpl.Name, err)
		}
		if _, err := neighbour.ResourceV1().ResourceClaimTemplates(other).Create(ctx, tpl, metav1.CreateOptions{}); err != nil {
			t.Fatalf("neighbour creates template %s: %v", tpl.Name, err)
		}
	}
	// A selector that fails at run time (no such attribute).
	failing := shareTemplate("failing-selector", "256Mi", "")
	failing.Spec.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
		Expression: `device.attributes["gpu.tessera.dev"].nosuchattribute == "x"`,
	}}}
	// More devices than the allocator allocates for one claim.
	many := shareTemplate("too-many", "256Mi", "")
	many.Spec.Spec.Devices.Requests[0].Exactly.Capacity = nil
	many.Spec.Spec.Devices.Requests[0].Exactly.AllocationMode = resourceapi.DeviceAllocationModeExactCount
	many.Spec.Spec.Devices.Requests[0].Exactly.Count = 64
	var bad []string
	for _, tpl := range []*resourceapi.ResourceClaimTemplate{failing, many} {
		if _, err := tenant.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tpl, metav1.CreateOptions{}); err != nil {
			t.Logf("the API server refuses template %s itself: %v", tpl.Name, err)
			continue
		}
		bad = append(bad, tpl.Name)
	}

	var rows []attack
	row := func(name string, held bool, outcome string, args ...any) {
		rows = append(rows, attack{name: name, held: held, outcome: fmt.Sprintf(outcome, args...)})
		if !held {
			t.Errorf("attack %q succeeded: %s", name, fmt.Sprintf(outcome, args...))
		}
	}
	refused := func(err error) (bool, string) {
		if err == nil {
			return false, "allowed"
		}
		msg := err.Error()
		if i := strings.Index(msg, "denied request: "); i >= 0 {
			msg = msg[i+len("denied request: "):]
		}
		return true, "refused: " + msg
	}
	queued := func(p *corev1.Pod, q string) *corev1.Pod {
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		p.Labels["tessera.dev/queue"] = q
		return p
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
	pods := tenant.CoreV1().Pods(ns)
	getPod := func(n, name string) *corev1.Pod {
		p, err := admin.CoreV1().Pods(n).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("reading pod %s/%s: %v", n, name, err)
		}
		return p
	}

	// Class 1: state the controller decides from cannot be forged.
	forged := queued(claimPod("forged", "gpu"), "hostile-zero")
	forged.Annotations = map[string]string{"tessera.dev/admission-decision": "forged/1", "tessera.dev/simulated-node": "node-1"}
	_, err := pods.Create(ctx, forged, metav1.CreateOptions{})
	held, out := refused(err)
	row("create a pod with the controller's decision annotations (queue limit 0)", held, "%s", out)

	if _, err := pods.Create(ctx, queued(claimPod("waiting", "gpu"), "hostile-zero"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("tenant creates a pod in queue hostile-zero: %v", err)
	}
	for _, a := range []string{"tessera.dev/admission-decision", "tessera.dev/admitted-at", "tessera.dev/simulated-node"} {
		_, err := pods.Patch(ctx, "waiting", types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"forged/1"}}}`, a), metav1.PatchOptions{})
		held, out := refused(err)
		row("add "+a+" to a waiting pod", held, "%s", out)
	}
	_, err = pods.Patch(ctx, "waiting", types.MergePatchType, []byte(`{"metadata":{"labels":{"tessera.dev/admitted":"true"}}}`), metav1.PatchOptions{})
	held, out = refused(err)
	row("add an undocumented tessera.dev/ label to a waiting pod", held, "%s", out)

	// Class 2: bad claims in one queue do not stall another tenant.
	for _, name := range bad {
		if _, err := pods.Create(ctx, queued(claimPod("bad-"+name, name), "hostile-a"), metav1.CreateOptions{}); err != nil {
			t.Fatalf("tenant creates pod with claim %s: %v", name, err)
		}
	}
	start := time.Now()
	if _, err := neighbour.CoreV1().Pods(other).Create(ctx, queued(claimPod("good", "small"), "hostile-b"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("neighbour creates its pod: %v", err)
	}
	waitFor(t, 90*time.Second, "the neighbour's 256Mi pod admitted next to the bad claims", func(ctx context.Context) (bool, error) {
		return !gated(getPod(other, "good")), nil
	})
	row("bad claims (failing selector, too many devices) stall another tenant's pod", true, "neighbour's pod admitted after %s", time.Since(start).Round(time.Second))
	for _, name := range bad {
		var msg string
		waitFor(t, 60*time.Second, "a reason on pod bad-"+name, func(ctx context.Context) (bool, error) {
			p := getPod(ns, "bad-"+name)
			msg = admissionMessage(p)
			return msg != "" || !gated(p), nil
		})
		p := getPod(ns, "bad-"+name)
		row("admit a claim the scheduler can never allocate ("+name+")", gated(p), "stays gated: %s", msg)
	}

	// Class 3: a claim shared by pods of two queues is charged once and
	// never moves into the queue whose limit is 0.
	shared := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "shared"}, Spec: shareTemplate("x", "1Gi", "").Spec.Spec}
	if _, err := tenant.ResourceV1().ResourceClaims(ns).Create(ctx, shared, metav1.CreateOptions{}); err != nil {
		t.Fatalf("tenant creates claim shared: %v", err)
	}
	sharedPod := func(name, q string) *corev1.Pod {
		p := claimPod(name, "")
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: new("shared")}}
		return queued(p, q)
	}
	if _, err := pods.Create(ctx, sharedPod("shared-a", "hostile-a"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodPhase(t, ns, "shared-a", corev1.PodRunning, 2*time.Minute)
	if _, err := pods.Create(ctx, sharedPod("shared-zero", "hostile-zero"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var msg string
	waitFor(t, 60*time.Second, "a reason on pod shared-zero", func(ctx context.Context) (bool, error) {
		p := getPod(ns, "shared-zero")
		msg = admissionMessage(p)
		return msg != "" || !gated(p), nil
	})
	row("use a claim admitted in another queue from a queue whose limit is 0", gated(getPod(ns, "shared-zero")), "stays gated: %s", msg)
	grace := int64(0)
	if err := pods.Delete(ctx, "shared-a", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 90*time.Second, "pod shared-a gone", func(ctx context.Context) (bool, error) {
		_, err := admin.CoreV1().Pods(ns).Get(ctx, "shared-a", metav1.GetOptions{})
		return err != nil, nil
	})
	time.Sleep(5 * time.Second) // a few cycles
	row("move a shared claim's charge into a queue whose limit is 0 (first user ends)",
		charge("hostile-zero") == "0" && gated(getPod(ns, "shared-zero")), "hostile-zero charged %s, shared-zero gated %v", charge("hostile-zero"), gated(getPod(ns, "shared-zero")))

	// Special cases: NVIDIA_VISIBLE_DEVICES without a claim.
	legacy := busyboxPod("visible-all", "sleep", "3600")
	legacy.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
	_, err = pods.Create(ctx, legacy, metav1.CreateOptions{})
	held, out = refused(err)
	row("NVIDIA_VISIBLE_DEVICES=all in a pod with no claim (legacy NVIDIA runtime)", held, "%s", out)

	// A namespace that has just become managed: a claim pod created at once
	// is gated in the namespace's queue, three times over.
	fresh := newNamespace(t)
	label(fresh, map[string]string{"hostile": "a"})
	freshTenant := editClient(t, fresh)
	if _, err := freshTenant.ResourceV1().ResourceClaimTemplates(fresh).Create(ctx, shareTemplate("small", "256Mi", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	escaped := 0
	for i := range 3 {
		label(fresh, map[string]string{"tessera.dev/queue": "hostile-zero"})
		p, err := freshTenant.CoreV1().Pods(fresh).Create(ctx, claimPod(fmt.Sprintf("just-managed-%d", i), "small"), metav1.CreateOptions{})
		if err == nil && (!gated(p) || p.Labels["tessera.dev/queue"] != "hostile-zero") {
			escaped++
		}
		label(fresh, map[string]string{"tessera.dev/queue": ""})
		time.Sleep(2 * time.Second)
	}
	row("create a claim pod in the second a namespace becomes managed (3 tries)", escaped == 0, "%d of 3 escaped the queue", escaped)

	// No effect on the charges.
	row("queue hostile-zero's charge after every attack", charge("hostile-zero") == "0", "%s", charge("hostile-zero"))

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
	t.Logf("hostile admission attacks:\n%s", sb.String())
	fmt.Println(sb.String())
}
