//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/test/scenario"
)

// TestDemoQueues runs demo/queues with the controller installed: the
// webhook gates labelled pods, two teams share the node, the gang of 4
// waits until all four members fit and then starts together, a reclaim
// evicts the over-quota gang whole for a pod within its team's quota, and a
// limit keeps a pod gated with the numbers in its condition. Every step's
// expectations (the pods' demo.tessera.dev/expect annotations) are checked
// by the scenario runner as it applies the files; the final state is
// checked here.
func TestDemoQueues(t *testing.T) {
	s, ok := scenario.Find("queues")
	if !ok {
		t.Fatal("no scenario queues")
	}
	usePlugin(t, s.Plugin)
	if err := cluster.StartController(t.Context()); err != nil {
		t.Fatalf("starting the controller: %v", err)
	}
	t.Cleanup(func() {
		// Queues are cluster-scoped: children before their parent.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := cluster.Kubectl(ctx, "delete", "queues", "team-a", "team-b", "--ignore-not-found", "--wait"); err != nil {
			t.Logf("deleting the demo's queues: %v: %s", err, out)
		}
		_, _ = cluster.Kubectl(ctx, "delete", "queue", "lab", "--ignore-not-found")
	})
	ns := newNamespace(t)
	r := scenario.NewRun(scenarioEnv(t), s, ns)
	if err := r.Apply(t.Context()); err != nil {
		t.Fatalf("applying demo/queues: %v", err)
	}
	pls := placements(t, r)

	for _, name := range []string{"b-1", "a-2"} {
		pl, ok := pls[name]
		if !ok || pl.Pod.Status.Phase != corev1.PodRunning {
			t.Errorf("%s should run at the end (b-1 within team-b's quota is never reclaimed; a-2 runs after the reclaim): %+v", name, ok)
		}
	}
	for _, name := range []string{"train-0", "train-1", "train-2", "train-3"} {
		if pl, ok := pls[name]; ok && pl.Pod.Status.Phase == corev1.PodRunning && pl.Pod.DeletionTimestamp == nil {
			t.Errorf("gang member %s still runs: the reclaim should have evicted the gang whole", name)
		}
		if !hasEvent(t.Context(), ns, name, "Reclaimed") {
			t.Errorf("gang member %s has no Reclaimed event", name)
		}
	}
	// The controller explains a waiting pod in its next decision cycle.
	want := "queue team-a: needs 8Gi gpu memory; quota 12Gi, in use 8Gi, limit 12Gi"
	waitFor(t, time.Minute, "a-3 gated with the reason "+want, func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "a-3", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if gated(p) && strings.Contains(admissionMessage(p), want) {
			return true, nil
		}
		return false, fmt.Errorf("a-3 gates %v, tessera.dev/Admission condition %q", p.Spec.SchedulingGates, admissionMessage(p))
	})
	var files []string
	for _, name := range []string{"b-1", "a-2"} {
		for _, c := range pls[name].Claims {
			files = append(files, hostFilesOfClaim(t, c.UID)...)
		}
	}
	cleanupAndCheck(t, r, files)
}

func gated(p *corev1.Pod) bool {
	for _, g := range p.Spec.SchedulingGates {
		if g.Name == "tessera.dev/admission" {
			return true
		}
	}
	return false
}

func admissionMessage(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == "tessera.dev/Admission" {
			return c.Message
		}
	}
	return ""
}

func hasEvent(ctx context.Context, ns, pod, reason string) bool {
	for _, e := range podEvents(ctx, ns, pod) {
		if e.Reason == reason {
			return true
		}
	}
	return false
}

// TestDemoGangJob applies demo/gang-job on the local cluster: two indexed
// Jobs of 4 workers, each Job one gang through its pod template's labels.
// The Job controller creates the pods; the 4 x 8Gi gang stays gated whole
// (2 of 4 fit, then none next to the other Job), the 4 x 6Gi gang starts
// whole, its admission decision recorded on every worker.
func TestDemoGangJob(t *testing.T) {
	s, ok := scenario.Find("gang-job")
	if !ok {
		t.Fatal("no scenario gang-job")
	}
	usePlugin(t, s.Plugin)
	if err := cluster.StartController(t.Context()); err != nil {
		t.Fatalf("starting the controller: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := cluster.Kubectl(ctx, "delete", "queue", "batch", "--ignore-not-found", "--wait"); err != nil {
			t.Logf("deleting the demo's queue: %v: %s", err, out)
		}
	})
	ns := newNamespace(t)
	r := scenario.NewRun(scenarioEnv(t), s, ns)
	files, err := s.Files(r.RepoRoot)
	if err != nil || len(files) != 3 {
		t.Fatalf("demo/gang-job files %v (%v), want 3 steps", files, err)
	}
	sweepWaits := func(want string) {
		t.Helper()
		waitFor(t, time.Minute, "every sweep worker gated with "+want, func(ctx context.Context) (bool, error) {
			sweep, err := r.JobPods(ctx, "sweep")
			if err != nil {
				return false, err
			}
			if len(sweep) != 4 {
				return false, fmt.Errorf("job sweep has %d pods", len(sweep))
			}
			for i := range sweep {
				p := &sweep[i]
				if !gated(p) || p.Spec.NodeName != "" || !strings.Contains(admissionMessage(p), want) {
					return false, fmt.Errorf("sweep worker %s: gates %v, node %q, condition %q", p.Name, p.Spec.SchedulingGates, p.Spec.NodeName, admissionMessage(p))
				}
			}
			return true, nil
		})
	}
	for _, f := range files[:2] {
		if err := r.ApplyFile(t.Context(), f); err != nil {
			t.Fatalf("applying %s: %v", f, err)
		}
	}
	sweepWaits("gang sweep: 2 of 4 members' claims fit")
	if err := r.ApplyFile(t.Context(), files[2]); err != nil {
		t.Fatalf("applying %s: %v", files[2], err)
	}
	train, err := r.JobPods(t.Context(), "train")
	if err != nil || len(train) != 4 {
		t.Fatalf("job train has %d pods (%v), want 4", len(train), err)
	}
	decisions := map[string]bool{}
	var hostFiles []string
	pls := placements(t, r)
	for _, p := range train {
		if p.Status.Phase != corev1.PodRunning {
			t.Errorf("worker %s of train is %s, want Running", p.Name, p.Status.Phase)
		}
		d := p.Annotations["tessera.dev/admission-decision"]
		if !strings.HasSuffix(d, "/4") {
			t.Errorf("worker %s carries admission decision %q, want <id>/4", p.Name, d)
		}
		decisions[d] = true
		for _, c := range pls[p.Name].Claims {
			hostFiles = append(hostFiles, hostFilesOfClaim(t, c.UID)...)
		}
	}
	if len(decisions) != 1 {
		t.Errorf("train's workers were admitted by %d decisions %v, want one", len(decisions), decisions)
	}
	// Next to train (12Gi on each T4), no 8Gi share fits at all.
	sweepWaits("gang sweep: 0 of 4 members' claims fit")
	cleanupAndCheck(t, r, hostFiles)
}
