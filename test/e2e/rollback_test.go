//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/test/localcluster"
	"github.com/tessera-dev/tessera/test/scenario"
)

// TestHelmRollback: the release is upgraded (plugin and controller at
// logVerbosity 5), then a pod with a share claim runs in a queue whose
// limit keeps a second, larger pod gated, then `helm rollback` returns
// both components to the previous revision. The running pod is untouched
// (same UID and container, no restart, its claim still allocated to it and
// its files on the node), the gated pod stays gated for the same reason
// (the rolled-back controller keeps the queue's limit), a new queued pod
// is admitted and its claim prepares (admission and prepare resume), and
// the claim prepared by the upgraded plugin is unprepared cleanly by the
// rolled-back one. The rollback's duration (helm rollback until the plugin
// and the controller are ready) and the time until the first admission
// after it are logged. Chart mode only.
func TestHelmRollback(t *testing.T) {
	requireChart(t, "the driver runs as host processes, there is no release to roll back")
	usePlugin(t, defaultPlugin)
	ctx := t.Context()
	startController(t)
	const queue = "rollback-e2e"
	applyYAML(t, "apiVersion: tessera.dev/v1alpha1\nkind: Queue\nmetadata: {name: "+queue+"}\nspec:\n  resources:\n    gpu.tessera.dev/memory: {limit: 2Gi}\n")
	ns := newNamespace(t)
	createTemplate(t, ns, shareTemplate("share-1gi", "1Gi", ""))
	createTemplate(t, ns, shareTemplate("share-2gi", "2Gi", ""))
	queued := func(name, template string) *corev1.Pod {
		p := claimPod(name, template)
		p.Labels = map[string]string{v1alpha1.QueueLabel: queue}
		return p
	}

	// Revision N+1: both components changed.
	revBefore, err := cluster.ChartRevision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	upgraded := localcluster.PluginConfig{Profile: defaultPlugin.Profile, Args: []string{"-v=5"}}
	if err := cluster.UpgradeChart(ctx, upgraded, map[string]any{"controller": map[string]any{"logVerbosity": 5}}); err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	checkVerbosity(ctx, t, "after the upgrade", true)

	// A running pod (admitted, prepared by the upgraded plugin) and a pod the
	// queue's limit keeps gated (2Gi more than the 1Gi in use would exceed 2Gi).
	r := scenario.NewRun(scenarioEnv(t), scenario.Scenario{Name: "helm-rollback"}, ns)
	r.Expect["waiting"] = corev1.PodPending
	createPod(t, ns, queued("running", "share-1gi"))
	if err := r.WaitPods(ctx, []string{"running"}); err != nil {
		t.Fatal(err)
	}
	createPod(t, ns, queued("waiting", "share-2gi"))
	checkGatedByLimit(t, ns, "waiting")
	pls := placements(t, r)
	c, _ := oneDevice(t, pls["running"])
	files := hostFilesOfClaim(t, c.UID)
	before := pls["running"].Pod
	if len(before.Status.ContainerStatuses) != 1 {
		t.Fatalf("pod running has container statuses %+v", before.Status.ContainerStatuses)
	}
	pluginBefore, err := cluster.PluginPod(ctx)
	if err != nil || pluginBefore == nil {
		t.Fatalf("the plugin's DaemonSet pod: %v", err)
	}
	controllerBefore := controllerPodUIDs(ctx, t)

	took, err := cluster.RollbackChart(ctx)
	if err != nil {
		t.Fatalf("helm rollback: %v", err)
	}
	rolledBack := time.Now()
	t.Logf("helm rollback to revision %d: plugin and controller rolled out and ready after %.1fs", revBefore, took.Seconds())

	if rev, err := cluster.ChartRevision(ctx); err != nil || rev != revBefore+2 {
		t.Errorf("release revision %d after the rollback (err %v), want %d (a rollback is a new revision)", rev, err, revBefore+2)
	}
	checkVerbosity(ctx, t, "after the rollback", false)
	if p, err := cluster.PluginPod(ctx); err != nil || p == nil || p.UID == pluginBefore.UID {
		t.Errorf("the plugin's pod after the rollback: %v (err %v); want a new pod in place of %s", p, err, pluginBefore.Name)
	}
	for uid := range controllerPodUIDs(ctx, t) {
		if controllerBefore[uid] {
			t.Errorf("controller pod %s was not replaced by the rollback", uid)
		}
	}

	// The running pod did not notice; its claim is still allocated to it and
	// prepared.
	p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "running", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !sameContainerRunning(before, p) {
		t.Errorf("after the rollback pod running is %s (uid %s), containers %+v; want uid %s, container %s still running, no restart",
			p.Status.Phase, p.UID, p.Status.ContainerStatuses, before.UID, before.Status.ContainerStatuses[0].ContainerID)
	}
	claim, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, c.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.UID != c.UID || claim.Status.Allocation == nil || !slices.ContainsFunc(claim.Status.ReservedFor, func(ref resourceapi.ResourceClaimConsumerReference) bool { return ref.UID == p.UID }) {
		t.Errorf("claim %s after the rollback: uid %s, allocation %v, reservedFor %+v; want it allocated and reserved for pod running", c.Name, claim.UID, claim.Status.Allocation != nil, claim.Status.ReservedFor)
	}
	for _, f := range files {
		checkPresent(t, f)
	}

	// Admission resumes with the same queue rules.
	checkGatedByLimit(t, ns, "waiting")
	r.Expect["waiting"] = corev1.PodPending
	createPod(t, ns, queued("after", "share-1gi"))
	waitFor(t, 2*time.Minute, "pod after admitted", func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "after", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return !gated(p), nil
	})
	t.Logf("first admission after the rollback: %.1fs after the plugin and controller were ready (%.1fs after helm rollback started)",
		time.Since(rolledBack).Seconds(), (took + time.Since(rolledBack)).Seconds())
	if err := r.WaitPods(ctx, []string{"after"}); err != nil {
		t.Fatalf("a new pod after the rollback: %v", err)
	}
	after := placements(t, r)
	ca, _ := oneDevice(t, after["after"])
	newFiles := hostFilesOfClaim(t, ca.UID)

	// The claim the upgraded plugin prepared unprepares with the rolled-back one.
	if err := r.DeletePod(ctx, "running", time.Minute); err != nil {
		t.Fatal(err)
	}
	checkGone(t, "after deleting the pod prepared before the rollback", files)
	for _, f := range newFiles {
		checkPresent(t, f)
	}
	cleanupAndCheck(t, r, newFiles)
}

// checkGatedByLimit waits until the pod is gated and its admission
// condition names the queue's limit of 2Gi.
func checkGatedByLimit(t *testing.T, ns, name string) {
	t.Helper()
	waitFor(t, time.Minute, name+" gated by the queue's limit", func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if gated(p) && strings.Contains(admissionMessage(p), "limit 2Gi") {
			return true, nil
		}
		return false, fmt.Errorf("%s: gates %v, admission condition %q", name, p.Spec.SchedulingGates, admissionMessage(p))
	})
}

// checkVerbosity checks whether the plugin's DaemonSet and the controller's
// Deployment run with -v=5.
func checkVerbosity(ctx context.Context, t *testing.T, when string, want bool) {
	t.Helper()
	args, err := cluster.PluginArgsInChart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Contains(args, "-v=5"); got != want {
		t.Errorf("%s: the plugin's arguments %v; -v=5 there: %v, want %v", when, args, got, want)
	}
	d, err := cluster.Client.AppsV1().Deployments(localcluster.ChartNamespace).Get(ctx, localcluster.ChartController, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var cargs []string
	for _, ctr := range d.Spec.Template.Spec.Containers {
		cargs = append(cargs, ctr.Args...)
	}
	if got := slices.Contains(cargs, "-v=5"); got != want {
		t.Errorf("%s: the controller's arguments %v; -v=5 there: %v, want %v", when, cargs, got, want)
	}
}

// controllerPodUIDs are the UIDs of the controller's pods not being deleted.
func controllerPodUIDs(ctx context.Context, t *testing.T) map[string]bool {
	t.Helper()
	pods, err := cluster.Client.CoreV1().Pods(localcluster.ChartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=controller"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out[string(p.UID)] = true
		}
	}
	return out
}
