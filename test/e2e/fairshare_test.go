//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// TestTimeBasedFairShare checks the worked example of docs/controller.md
// ("Time-based fair share", pkg/control/queue/usageweight_test.go) on the local
// cluster: parent tfs-research weighs usage; its children tfs-a and tfs-b
// have weight 1 and no quota. Two unqueued 12Gi pods take most of both
// T4s; tfs-a then runs a 1Gi pod until its history (every 5 s) holds
// decayed usage, and the pod goes. Then both children ask for four 8Gi
// shares each, which cannot fit: nothing is admitted, nothing runs, so
// the usage (only tfs-a's) stands still and the split is deterministic.
// With only tfs-a having used anything, its part of the siblings' usage is
// 1 whatever the amount: factor 1 gives weights 1/2 and 1, so tfs-a gets
// 1/3 of the parent's fair share and tfs-b 2/3 (the example's 2.67 and
// 5.33 of 8); factor 3 gives 1/4 and 1 (1/5 and 4/5); usageWeighting off
// gives an even split. Checked on both resources, polling the status.
func TestTimeBasedFairShare(t *testing.T) {
	requireChart(t, "the history interval is set by the chart's local-cluster values")
	usePlugin(t, defaultPlugin)
	ctx := t.Context()
	startController(t)
	parent := func(weighting string) string {
		return "metadata: {name: tfs-research}\nspec:\n  fairSharing: {usageWeighting: " + weighting + "}\n"
	}
	applyQueues(t, parent("{enabled: true, factor: '1'}"),
		"metadata: {name: tfs-a}\nspec: {parent: tfs-research}\n",
		"metadata: {name: tfs-b}\nspec: {parent: tfs-research}\n")

	// Blockers, in no queue: 12Gi on each GPU.
	blockNS := newNamespace(t)
	createTemplate(t, blockNS, shareTemplate("share-12gi", "12Gi", ""))
	for _, name := range []string{"block-0", "block-1"} {
		createPod(t, blockNS, claimPod(name, "share-12gi"))
	}
	for _, name := range []string{"block-0", "block-1"} {
		waitPodPhase(t, blockNS, name, corev1.PodRunning, 2*time.Minute)
	}

	// tfs-a's recent usage: a 1Gi share until the history shows it.
	nsA, nsB := newNamespace(t), newNamespace(t)
	createTemplate(t, nsA, shareTemplate("share-1gi", "1Gi", ""))
	used := claimPod("used", "share-1gi")
	used.Labels = map[string]string{v1alpha1.QueueLabel: "tfs-a"}
	createPod(t, nsA, used)
	waitPodPhase(t, nsA, "used", corev1.PodRunning, 2*time.Minute)
	waitFor(t, time.Minute, "tfs-a's decayed usage", func(ctx context.Context) (bool, error) {
		q, err := getQueue(ctx, "tfs-a")
		if err != nil {
			return false, err
		}
		u := q.Status.Usage
		if u == nil {
			return false, fmt.Errorf("no status.usage")
		}
		return u.Decayed.AllocatedGPUHours != "" && u.Decayed.AllocatedMemoryGiBHours != "", fmt.Errorf("decayed %+v", u.Decayed)
	})
	grace := int64(1)
	if err := cluster.Client.CoreV1().Pods(nsA).Delete(ctx, "used", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	if q, err := getQueue(ctx, "tfs-b"); err != nil || (q.Status.Usage != nil && q.Status.Usage.Decayed != (v1alpha1.UsageAmounts{})) {
		t.Fatalf("tfs-b must have no usage: %v %+v", err, q.Status.Usage)
	}

	// Both children ask for more than the cluster has; nothing fits.
	for _, ns := range []string{nsA, nsB} {
		createTemplate(t, ns, shareTemplate("share-8gi", "8Gi", ""))
		for i := range 4 {
			p := claimPod(fmt.Sprintf("want-%d", i), "share-8gi")
			p.Labels = map[string]string{v1alpha1.QueueLabel: map[string]string{nsA: "tfs-a", nsB: "tfs-b"}[ns]}
			createPod(t, ns, p)
		}
	}

	// split waits until tfs-a holds partA of tfs-research's fair share and
	// tfs-b the rest, on both resources, with all eight pods pending.
	split := func(what string, partA float64) {
		t.Helper()
		waitFor(t, 2*time.Minute, what, func(ctx context.Context) (bool, error) {
			qs := map[string]*v1alpha1.Queue{}
			for _, name := range []string{"tfs-research", "tfs-a", "tfs-b"} {
				q, err := getQueue(ctx, name)
				if err != nil {
					return false, err
				}
				qs[name] = q
			}
			for _, name := range []string{"tfs-a", "tfs-b"} {
				if st := qs[name].Status; st.PendingWorkloads != 4 || st.AdmittedWorkloads != 0 {
					return false, fmt.Errorf("%s: %d pending, %d admitted; want 4 and 0", name, st.PendingWorkloads, st.AdmittedWorkloads)
				}
			}
			for _, r := range []v1alpha1.ResourceName{v1alpha1.ResourceGPUMemory, v1alpha1.ResourceGPUs} {
				fs := func(q string) float64 {
					v := qs[q].Status.FairShare[r]
					return v.AsApproximateFloat64()
				}
				total, a, b := fs("tfs-research"), fs("tfs-a"), fs("tfs-b")
				if total <= 0 {
					return false, fmt.Errorf("tfs-research has no fair share of %s", r)
				}
				if math.Abs(a/total-partA) > 0.005 || math.Abs(b/total-(1-partA)) > 0.005 {
					return false, fmt.Errorf("%s: tfs-a %.4f, tfs-b %.4f of tfs-research's %v; want %.4f and %.4f", r, a/total, b/total, total, partA, 1-partA)
				}
			}
			t.Logf("%s: fair shares %v, %v of %v", what, qs["tfs-a"].Status.FairShare, qs["tfs-b"].Status.FairShare, qs["tfs-research"].Status.FairShare)
			return true, nil
		})
	}
	split("factor 1: tfs-a gets 1/3", 1.0/3)
	applyQueues(t, parent("{enabled: true, factor: '3'}"))
	split("factor 3: tfs-a gets 1/5", 1.0/5)
	applyQueues(t, parent("{enabled: false}"))
	split("usageWeighting off: even split", 1.0/2)
	if out, err := cluster.Kubectl(ctx, "get", "queues", "tfs-research", "tfs-a", "tfs-b", "-o", "wide"); err == nil {
		t.Logf("kubectl get queues -o wide:\n%s", out)
	}
}

func getQueue(ctx context.Context, name string) (*v1alpha1.Queue, error) {
	out, err := cluster.Kubectl(ctx, "get", "queue", name, "-o", "json")
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, out)
	}
	var q v1alpha1.Queue
	if err := json.Unmarshal([]byte(out), &q); err != nil {
		return nil, err
	}
	return &q, nil
}
