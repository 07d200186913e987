//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// TestReclaimVictims: reclaim does not wait for its victims' consent. On
// the local cluster's two T4s, tenants with `edit` of an over-quota queue
// run two 10Gi shares, one per GPU (4.75Gi idle on each), that ignore
// SIGTERM; a within-quota tenant asks 12Gi, which only a whole GPU's
// worth frees.
//   - a PodDisruptionBudget on the first victim (the most recently
//     admitted), a 600 s grace period on the other: the budget's refusal
//     passes reclaim to the other victim, whose eviction cuts its grace
//     period to the chart's 30 s; the within-quota pod runs within about a
//     minute (not ten), the budget's pod keeps running, and another queue's
//     2Gi pod gets idle memory meanwhile rather than waiting on a reclaim
//     that cannot go on;
//   - budgets on both victims: one is deleted past its budget
//     (controller.reclaimPastBudgets), the other keeps running.
//
// The waiting pod's condition says what it waits for, without naming the
// other namespace's pods.
func TestReclaimVictims(t *testing.T) {
	requireChart(t, "reclaim past a budget needs the chart's delete grant and policy")
	usePlugin(t, defaultPlugin)
	startController(t)
	applyYAML(t, `apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: rc-a}
spec:
  resources:
    gpu.tessera.dev/memory: {quota: 13Gi}
---
apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: rc-b}
spec:
  resources:
    gpu.tessera.dev/memory: {quota: "0"}
---
apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: rc-c}
spec:
  resources:
    gpu.tessera.dev/memory: {quota: "0"}
`)
	t.Run("a budget on the first victim, 600 s of grace on the other", func(t *testing.T) {
		ctx := t.Context()
		nsA, nsB, nsC := newNamespace(t), newNamespace(t), newNamespace(t)
		a, b, c := tenantWithTemplates(t, nsA), tenantWithTemplates(t, nsB), tenantWithTemplates(t, nsC)
		runVictims(t, b, nsB, map[string]int64{"b-0": 600})
		budget(t, b, nsB, "b-1")
		start := time.Now()
		createQueued(t, a, nsA, "a-0", "s12", "rc-a")
		createQueued(t, c, nsC, "c-0", "s2", "rc-c")

		waitFor(t, time.Minute, "the budget refuses b-1's eviction", func(ctx context.Context) (bool, error) {
			return hasEvent(ctx, nsB, "b-1", "EvictionRefused"), nil
		})
		var grace int64 = -1
		var messages []string
		waitFor(t, 3*time.Minute, "a-0 running", func(ctx context.Context) (bool, error) {
			if p, err := cluster.Client.CoreV1().Pods(nsB).Get(ctx, "b-0", metav1.GetOptions{}); err == nil && p.DeletionTimestamp != nil {
				grace = ptr.Deref(p.DeletionGracePeriodSeconds, -1)
			}
			p, err := cluster.Client.CoreV1().Pods(nsA).Get(ctx, "a-0", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if m := admissionMessage(p); m != "" && (len(messages) == 0 || messages[len(messages)-1] != m) {
				messages = append(messages, m)
			}
			return p.Status.Phase == corev1.PodRunning, nil
		})
		took := time.Since(start)
		t.Logf("a-0 ran %s after it was created; its conditions said:\n%s", took.Round(time.Second), strings.Join(messages, "\n"))
		if grace != 30 {
			t.Errorf("b-0 was deleted with a grace period of %d s, want 30 (the reclaim bound; its own is 600)", grace)
		}
		if took > 150*time.Second {
			t.Errorf("a-0 ran %s after it was created: its victim's 600 s grace period held it", took)
		}
		waiting := false
		for _, m := range messages {
			if strings.Contains(m, "b-0") || strings.Contains(m, "b-1") {
				t.Errorf("a-0's condition names another namespace's pod: %q", m)
			}
			waiting = waiting || strings.Contains(m, "waiting for evicted workloads to end: a workload of another namespace (queue rc-b), due to end by")
		}
		if !waiting {
			t.Errorf("a-0's condition never said what it waits for (a workload of queue rc-b, and when it is due to end)")
		}
		if p, err := cluster.Client.CoreV1().Pods(nsB).Get(ctx, "b-1", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			t.Errorf("b-1, protected by its budget while another victim made room, is not running undisturbed: %v", err)
		}
		waitPodPhase(t, nsC, "c-0", corev1.PodRunning, 2*time.Minute)
	})

	t.Run("budgets on both victims", func(t *testing.T) {
		ctx := t.Context()
		nsA, nsB := newNamespace(t), newNamespace(t)
		a, b := tenantWithTemplates(t, nsA), tenantWithTemplates(t, nsB)
		runVictims(t, b, nsB, nil)
		budget(t, b, nsB, "b-0")
		budget(t, b, nsB, "b-1")
		start := time.Now()
		createQueued(t, a, nsA, "a-1", "s12", "rc-a")
		waitPodPhase(t, nsA, "a-1", corev1.PodRunning, 3*time.Minute)
		t.Logf("a-1 ran %s after it was created", time.Since(start).Round(time.Second))
		gone := 0
		for _, n := range []string{"b-0", "b-1"} {
			if !hasEvent(ctx, nsB, n, "EvictionRefused") {
				t.Errorf("%s's budget never refused its eviction: the test proves nothing", n)
			}
			p, err := cluster.Client.CoreV1().Pods(nsB).Get(ctx, n, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil) {
				gone++
			}
		}
		if gone != 1 {
			t.Errorf("%d of the two budget-protected victims were deleted, want exactly one (the fewest that make room)", gone)
		}
	})
}

// tenantWithTemplates is an edit client of ns with share templates s2, s10
// and s12 (2, 10 and 12 GiB).
func tenantWithTemplates(t *testing.T, ns string) kubernetes.Interface {
	t.Helper()
	c := editClient(t, ns)
	for _, s := range []string{"2", "10", "12"} {
		// The tenant's RoleBinding reaches the API server's authorizer
		// within moments.
		waitFor(t, 30*time.Second, "tenant creates template s"+s, func(ctx context.Context) (bool, error) {
			_, err := c.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, shareTemplate("s"+s, s+"Gi", ""), metav1.CreateOptions{})
			return err == nil, err
		})
	}
	return c
}

// createQueued creates, as the tenant, a pod of queue q with a claim from
// template tpl, labelled app=<name>.
func createQueued(t *testing.T, c kubernetes.Interface, ns, name, tpl, q string) *corev1.Pod {
	t.Helper()
	p := claimPod(name, tpl)
	p.Labels = map[string]string{"tessera.dev/queue": q, "app": name}
	// PID 1 without a handler ignores SIGTERM: only the kill at the end
	// of the grace period stops it.
	p.Spec.Containers[0].Command = []string{"sleep", "3600"}
	p, err := c.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("tenant creates pod %s: %v", name, err)
	}
	return p
}

// runVictims starts b-0 and then b-1 (10Gi shares of queue rc-b, one per
// GPU) and waits for both to run; grace sets pods' own grace periods.
func runVictims(t *testing.T, c kubernetes.Interface, ns string, grace map[string]int64) {
	t.Helper()
	for _, n := range []string{"b-0", "b-1"} {
		p := claimPod(n, "s10")
		p.Labels = map[string]string{"tessera.dev/queue": "rc-b", "app": n}
		p.Spec.Containers[0].Command = []string{"sleep", "3600"}
		if g, ok := grace[n]; ok {
			p.Spec.TerminationGracePeriodSeconds = ptr.To(g)
		}
		if _, err := c.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("tenant creates %s: %v", n, err)
		}
		waitPodPhase(t, ns, n, corev1.PodRunning, 2*time.Minute)
	}
}

// budget has the tenant protect pod app=<app> with a PodDisruptionBudget
// that allows no disruption, and waits until the disruption controller has
// processed it (the Eviction API refuses either way).
func budget(t *testing.T, c kubernetes.Interface, ns, app string) {
	t.Helper()
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: app},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: ptr.To(intstr.FromInt32(0)),
			Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
		},
	}
	if _, err := c.PolicyV1().PodDisruptionBudgets(ns).Create(t.Context(), pdb, metav1.CreateOptions{}); err != nil {
		t.Fatalf("tenant creates a PodDisruptionBudget for %s: %v", app, err)
	}
	waitFor(t, time.Minute, fmt.Sprintf("budget %s processed", app), func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, app, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.Status.ObservedGeneration == p.Generation && p.Status.CurrentHealthy == 1 && p.Status.DisruptionsAllowed == 0, nil
	})
}
