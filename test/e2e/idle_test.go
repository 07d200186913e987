//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// TestIdleReclaim: a queue with spec.idle {after: 1m, usedBelow: 5%,
// action: Report} holds two 4Gi shares; the "busy" pod's process uses 1Gi
// (the mock NVML reports host processes that set MOCK_GPU_MEMORY_USED),
// the "idle" pod runs none. After the window the idle pod carries the
// condition tessera.dev/Idle True (reason Idle) and an Idle event and
// keeps running (Report); once the queue's action is Evict it is evicted
// through the Eviction API. The busy pod is never marked and keeps
// running throughout.
func TestIdleReclaim(t *testing.T) {
	inParallel(t)
	ctx := t.Context()
	queue := "idle-e2e"
	f := filepath.Join(t.TempDir(), "queue.yaml")
	writeQueue := func(action v1alpha1.IdleAction) {
		t.Helper()
		y := fmt.Sprintf("apiVersion: tessera.dev/v1alpha1\nkind: Queue\nmetadata: {name: %s}\nspec:\n  idle: {after: 1m, usedBelow: 5%%, action: %s}\n", queue, action)
		if err := os.WriteFile(f, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := cluster.Kubectl(ctx, "apply", "-f", f); err != nil {
			t.Fatalf("applying the queue: %v: %s", err, out)
		}
	}
	writeQueue(v1alpha1.IdleReport)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = cluster.Kubectl(ctx, "delete", "-f", f, "--ignore-not-found")
	})

	// The API refuses a window under a minute and a threshold over 100%.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	for _, spec := range []string{"{after: 30s, usedBelow: 5%}", "{after: 1m, usedBelow: 150%}", "{after: 1m, usedBelow: '5'}"} {
		y := "apiVersion: tessera.dev/v1alpha1\nkind: Queue\nmetadata: {name: idle-e2e-bad}\nspec:\n  idle: " + spec + "\n"
		if err := os.WriteFile(bad, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := cluster.Kubectl(ctx, "apply", "--dry-run=server", "-f", bad); err == nil {
			t.Errorf("spec.idle %s accepted: %s", spec, out)
		}
	}

	ns := newNamespace(t)
	createTemplate(t, ns, shareTemplate("share-4gi", "4Gi", ""))
	for _, name := range []string{"idle", "busy"} {
		p := claimPod(name, "share-4gi")
		p.Labels = map[string]string{v1alpha1.QueueLabel: queue}
		if name == "busy" {
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "MOCK_GPU_MEMORY_USED", Value: "1Gi"})
		}
		createPod(t, ns, p)
	}
	for _, name := range []string{"idle", "busy"} {
		waitPodPhase(t, ns, name, corev1.PodRunning, 3*time.Minute)
	}
	idleCond := func(ctx context.Context, name string) (*corev1.Pod, *corev1.PodCondition, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, nil, err
		}
		for i := range p.Status.Conditions {
			if p.Status.Conditions[i].Type == v1alpha1.IdleCondition {
				return p, &p.Status.Conditions[i], nil
			}
		}
		return p, nil, nil
	}
	checkBusy := func() {
		t.Helper()
		p, c, err := idleCond(ctx, "busy")
		if err != nil {
			t.Fatalf("the busy pod: %v", err)
		}
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			t.Fatalf("the busy pod is %s (deleting: %v)", p.Status.Phase, p.DeletionTimestamp != nil)
		}
		if c != nil && c.Status == corev1.ConditionTrue {
			t.Fatalf("the busy pod is marked idle: %s: %s", c.Reason, c.Message)
		}
	}

	// Report: marked after the 1m window (15 s passes, 10 s samples), not evicted.
	waitFor(t, 3*time.Minute, "the idle pod marked idle", func(ctx context.Context) (bool, error) {
		_, c, err := idleCond(ctx, "idle")
		if err != nil {
			return false, err
		}
		if c == nil {
			return false, fmt.Errorf("no %s condition", v1alpha1.IdleCondition)
		}
		return c.Status == corev1.ConditionTrue && c.Reason == "Idle", fmt.Errorf("%s %s: %s", c.Status, c.Reason, c.Message)
	})
	_, c, _ := idleCond(ctx, "idle")
	t.Logf("idle pod: %s: %s", c.Reason, c.Message)
	found := false
	for _, e := range podEvents(ctx, ns, "idle") {
		if e.Reason == "Idle" {
			found = true
		}
	}
	if !found {
		t.Error("no Idle event on the idle pod")
	}
	checkBusy()
	// Two more passes: Report leaves it running.
	time.Sleep(40 * time.Second)
	if p, _, err := idleCond(ctx, "idle"); err != nil || p.DeletionTimestamp != nil {
		t.Fatalf("the idle pod under Report: %v (deleting: %v)", err, p != nil && p.DeletionTimestamp != nil)
	}
	checkBusy()

	// Evict: the idle pod goes through the Eviction API, the busy one stays.
	writeQueue(v1alpha1.IdleEvict)
	waitFor(t, 2*time.Minute, "the idle pod evicted", func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "idle", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return p.DeletionTimestamp != nil, fmt.Errorf("phase %s", p.Status.Phase)
	})
	found = false
	for _, e := range podEvents(ctx, ns, "idle") {
		if e.Reason == "IdleEvicted" {
			found = true
		}
	}
	if !found {
		t.Log("no IdleEvicted event listed (the pod may be gone with its events' involved object; not an error)")
	}
	checkBusy()
}
