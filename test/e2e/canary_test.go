//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/test/localcluster"
	"github.com/tessera-dev/tessera/test/scenario"
)

const canaryNodeLabel = "tessera.dev/plugin-canary"

// TestCanaryNodes: the release runs a canary plugin DaemonSet
// (kubeletPlugin.canary, the same image with TESSERA_PLUGIN_VARIANT=canary).
// Labelling the node moves it to the canary: the main pod goes, the canary
// pod serves, and a claim pod's claim is prepared by the canary (its log
// says so). Removing the label moves the node back: the main plugin serves,
// the claim pod keeps running untouched, and deleting it unprepares the
// claim through the main plugin (its log says so; CDI spec and checkpoint
// record gone, claim deallocated); a new claim pod prepares. The driver's
// ResourceSlices stay published across both moves. Chart mode only; the
// local cluster has one node, so both moves happen on it.
func TestCanaryNodes(t *testing.T) {
	requireChart(t, "the driver runs as host processes, there are no DaemonSets")
	usePlugin(t, defaultPlugin)
	ctx := t.Context()
	canaryValues := map[string]any{"kubeletPlugin": map[string]any{"canary": map[string]any{"enabled": true}}}
	if err := cluster.UpgradeChart(ctx, defaultPlugin, canaryValues); err != nil {
		t.Fatalf("helm upgrade with kubeletPlugin.canary.enabled: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := setNodeLabel(ctx, false); err != nil {
			t.Logf("removing the canary label: %v", err)
		}
		if err := cluster.UpgradeChart(ctx, defaultPlugin, nil); err != nil {
			t.Errorf("helm upgrade without the canary: %v", err)
		}
	})
	nodes, err := cluster.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 {
		t.Fatalf("the local cluster has %d nodes (err %v); the test flips its only node", len(nodes.Items), err)
	}
	slicesBefore := sliceUIDs(ctx, t)

	// The node moves to the canary.
	start := time.Now()
	if err := setNodeLabel(ctx, true); err != nil {
		t.Fatal(err)
	}
	canaryPod := waitVariant(t, "canary")
	t.Logf("node labelled %s=true: canary pod %s ready, main pod gone after %.1fs", canaryNodeLabel, canaryPod.Name, time.Since(start).Seconds())
	checkPublished(ctx, t, "on the canary")

	ns := newNamespace(t)
	createTemplate(t, ns, shareTemplate("share-1gi", "1Gi", ""))
	r := scenario.NewRun(scenarioEnv(t), scenario.Scenario{Name: "canary-nodes"}, ns)
	createPod(t, ns, claimPod("on-canary", "share-1gi"))
	if err := r.WaitPods(ctx, []string{"on-canary"}); err != nil {
		t.Fatal(err)
	}
	pls := placements(t, r)
	c, _ := oneDevice(t, pls["on-canary"])
	files := hostFilesOfClaim(t, c.UID)
	before := pls["on-canary"].Pod
	if l := pluginLog(ctx, t, canaryPod); !strings.Contains(l, `"Prepared claim"`) || !strings.Contains(l, ns+"/"+c.Name) {
		t.Errorf("the canary plugin's log does not show it prepared claim %s/%s", ns, c.Name)
	}

	// The node moves back to the main DaemonSet.
	start = time.Now()
	if err := setNodeLabel(ctx, false); err != nil {
		t.Fatal(err)
	}
	mainPod := waitVariant(t, "main")
	t.Logf("label removed: main pod %s ready, canary pod gone after %.1fs", mainPod.Name, time.Since(start).Seconds())
	checkPublished(ctx, t, "back on the main DaemonSet")
	if after := sliceUIDs(ctx, t); !slices.Equal(after, slicesBefore) {
		t.Logf("ResourceSlices were replaced during the moves: %v before, %v after (devices stayed published at every check)", slicesBefore, after)
	} else {
		t.Logf("the same ResourceSlices (%v) throughout both moves", after)
	}

	p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "on-canary", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !sameContainerRunning(before, p) {
		t.Errorf("after the moves pod on-canary is %s, containers %+v; want the same container still running", p.Status.Phase, p.Status.ContainerStatuses)
	}
	for _, f := range files {
		checkPresent(t, f)
	}

	// The main plugin unprepares what the canary prepared.
	if err := r.DeletePod(ctx, "on-canary", time.Minute); err != nil {
		t.Fatal(err)
	}
	checkGone(t, "after deleting the pod the canary prepared", files)
	waitFor(t, time.Minute, "claim "+c.Name+" deallocated or deleted", func(ctx context.Context) (bool, error) {
		cl, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, c.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		} else if err != nil {
			return false, err
		}
		return cl.Status.Allocation == nil && len(cl.Status.ReservedFor) == 0, nil
	})
	if l := pluginLog(ctx, t, mainPod); !strings.Contains(l, `"Unprepared claim"`) || !strings.Contains(l, string(c.UID)) {
		t.Errorf("the main plugin's log does not show it unprepared claim %s", c.UID)
	}

	// And prepares new claims.
	createPod(t, ns, claimPod("on-main", "share-1gi"))
	if err := r.WaitPods(ctx, []string{"on-main"}); err != nil {
		t.Fatalf("a new pod after the node moved back: %v", err)
	}
	after := placements(t, r)
	cm, _ := oneDevice(t, after["on-main"])
	cleanupAndCheck(t, r, hostFilesOfClaim(t, cm.UID))
}

// setNodeLabel sets (on) or removes the canary label on the local node.
func setNodeLabel(ctx context.Context, on bool) error {
	var v any
	if on {
		v = "true"
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{canaryNodeLabel: v}}})
	if err != nil {
		return err
	}
	_, err = cluster.Client.CoreV1().Nodes().Patch(ctx, localcluster.NodeName, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("labelling node %s: %w", localcluster.NodeName, err)
	}
	return nil
}

// waitVariant waits until the node runs exactly one plugin pod, of the
// given DaemonSet ("main" or "canary"), ready, and no pod of the other is
// left (not even terminating), and returns it.
func waitVariant(t *testing.T, variant string) *corev1.Pod {
	t.Helper()
	want, other := "kubelet-plugin", "kubelet-plugin-canary"
	if variant == "canary" {
		want, other = other, want
	}
	var pod *corev1.Pod
	waitFor(t, 3*time.Minute, "the "+variant+" plugin pod ready and the other gone", func(ctx context.Context) (bool, error) {
		list := func(component string) ([]corev1.Pod, error) {
			pods, err := cluster.Client.CoreV1().Pods(localcluster.ChartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=" + component})
			if err != nil {
				return nil, err
			}
			return pods.Items, nil
		}
		mine, err := list(want)
		if err != nil {
			return false, err
		}
		theirs, err := list(other)
		if err != nil {
			return false, err
		}
		if len(theirs) > 0 || len(mine) != 1 || mine[0].DeletionTimestamp != nil {
			return false, fmt.Errorf("%d %s pod(s), %d %s pod(s)", len(mine), want, len(theirs), other)
		}
		for _, cond := range mine[0].Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				pod = &mine[0]
				return true, nil
			}
		}
		return false, fmt.Errorf("%s pod %s not ready", want, mine[0].Name)
	})
	env := map[string]string{}
	for _, ctr := range pod.Spec.Containers {
		for _, e := range ctr.Env {
			env[e.Name] = e.Value
		}
	}
	if got := env["TESSERA_PLUGIN_VARIANT"]; (variant == "canary") != (got == "canary") {
		t.Fatalf("pod %s of the %s DaemonSet has TESSERA_PLUGIN_VARIANT=%q", pod.Name, variant, got)
	}
	return pod
}

// checkPublished waits until the driver's ResourceSlices of the node carry
// the devices the plugin publishes.
func checkPublished(ctx context.Context, t *testing.T, when string) {
	t.Helper()
	waitFor(t, time.Minute, "devices published "+when, func(ctx context.Context) (bool, error) {
		got, err := cluster.PublishedDevices(ctx)
		return len(got) > 0, err
	})
}

// sliceUIDs are the UIDs of the driver's ResourceSlices of the node, sorted.
func sliceUIDs(ctx context.Context, t *testing.T) []string {
	t.Helper()
	list, err := cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range list.Items {
		if s.Spec.Driver == localcluster.DriverName && s.Spec.NodeName != nil && *s.Spec.NodeName == localcluster.NodeName {
			out = append(out, string(s.UID))
		}
	}
	slices.Sort(out)
	return out
}

// pluginLog is a plugin pod's log.
func pluginLog(ctx context.Context, t *testing.T, p *corev1.Pod) string {
	t.Helper()
	b, err := cluster.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: "kubelet-plugin"}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("log of plugin pod %s: %v", p.Name, err)
	}
	return string(b)
}
