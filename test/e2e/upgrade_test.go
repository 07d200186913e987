//go:build e2e

package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/test/helm"
	"github.com/tessera-dev/tessera/test/localcluster"
	"github.com/tessera-dev/tessera/test/scenario"
)

// TestHelmUpgrade: `helm upgrade` of the release to a changed value
// (kubeletPlugin.logVerbosity) while a pod holds a share claim. The
// DaemonSet replaces the plugin's pod; the pod with the claim keeps running
// (same container, no restart) and its claim stays prepared; a new claim
// prepares with the upgraded plugin; deleting the old pod afterwards
// unprepares its claim cleanly (no CDI spec, checkpoint entry or accounting
// directory left). Chart mode only.
func TestHelmUpgrade(t *testing.T) {
	requireChart(t, "the driver runs as host processes, there is no release to upgrade")
	usePlugin(t, defaultPlugin)
	ctx := t.Context()
	ns := newNamespace(t)
	createTemplate(t, ns, shareTemplate("share-1gi", "1Gi", `{"apiVersion":"tessera.dev/v1alpha1","enforcement":"interposer","kind":"GpuConfig"}`))
	createPod(t, ns, claimPod("old", "share-1gi"))
	r := scenario.NewRun(scenarioEnv(t), scenario.Scenario{Name: "helm-upgrade"}, ns)
	if err := r.WaitPods(ctx, []string{"old"}); err != nil {
		t.Fatal(err)
	}
	pls := placements(t, r)
	c, d := oneDevice(t, pls["old"])
	checkEnv(t, ns, pls["old"], envWant{mode: "interposer", enforced: "advisory", uuid: d.Attributes["uuid"]})
	oldFiles := hostFilesOfClaim(t, c.UID)
	oldContainer := pls["old"].Pod.Status.ContainerStatuses[0].ContainerID

	pluginBefore, err := cluster.PluginPod(ctx)
	if err != nil || pluginBefore == nil {
		t.Fatalf("the plugin's DaemonSet pod: %v", err)
	}
	revBefore, err := cluster.ChartRevision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	args, err := cluster.PluginArgsInChart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(args, "-v=5") {
		t.Fatalf("the plugin already runs with -v=5: %v", args)
	}

	// kubeletPlugin.logVerbosity: 5 (the harness maps -v to it).
	upgraded := localcluster.PluginConfig{Profile: defaultPlugin.Profile, Args: []string{"-v=5"}}
	start := time.Now()
	if err := cluster.UpgradePlugin(ctx, upgraded); err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	t.Logf("helm upgrade to logVerbosity 5: new plugin pod registered and publishing after %.1fs", time.Since(start).Seconds())

	if rev, err := cluster.ChartRevision(ctx); err != nil || rev != revBefore+1 {
		t.Errorf("release revision %d after the upgrade (err %v), want %d", rev, err, revBefore+1)
	}
	if args, err := cluster.PluginArgsInChart(ctx); err != nil || !slices.Contains(args, "-v=5") {
		t.Errorf("the DaemonSet's plugin arguments %v (err %v) lack -v=5", args, err)
	}
	pluginAfter, err := cluster.PluginPod(ctx)
	if err != nil || pluginAfter == nil {
		t.Fatalf("the plugin's DaemonSet pod after the upgrade: %v", err)
	}
	if pluginAfter.UID == pluginBefore.UID {
		t.Fatalf("the DaemonSet did not replace its pod %s", pluginBefore.Name)
	}
	// With maxSurge 1 the DaemonSet deletes the old pod once the new one is
	// available; it goes when it has terminated (its grace period).
	waitFor(t, 90*time.Second, "the old plugin pod "+pluginBefore.Name+" gone", func(ctx context.Context) (bool, error) {
		_, err := cluster.Client.CoreV1().Pods(pluginBefore.Namespace).Get(ctx, pluginBefore.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	t.Logf("plugin pod %s replaced by %s", pluginBefore.Name, pluginAfter.Name)

	// The pod with the claim did not notice.
	p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "old", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cs := p.Status.ContainerStatuses; p.Status.Phase != corev1.PodRunning || len(cs) != 1 || cs[0].State.Running == nil || cs[0].ContainerID != oldContainer || cs[0].RestartCount != 0 {
		t.Errorf("after the upgrade pod old is %s, container %+v; want the same container (%s) still running", p.Status.Phase, p.Status.ContainerStatuses, oldContainer)
	}
	for _, f := range oldFiles {
		checkPresent(t, f)
	}

	// A new claim prepares with the upgraded plugin.
	createPod(t, ns, claimPod("new", "share-1gi"))
	if err := r.WaitPods(ctx, []string{"new"}); err != nil {
		t.Fatalf("a new pod after the upgrade: %v", err)
	}
	after := placements(t, r)
	c, d = oneDevice(t, after["new"])
	checkEnv(t, ns, after["new"], envWant{mode: "interposer", enforced: "advisory", uuid: d.Attributes["uuid"]})
	newFiles := hostFilesOfClaim(t, c.UID)

	// The claim the old plugin pod prepared unprepares cleanly.
	if err := r.DeletePod(ctx, "old", time.Minute); err != nil {
		t.Fatal(err)
	}
	checkGone(t, "after deleting the pod prepared before the upgrade", oldFiles)
	for _, f := range newFiles {
		checkPresent(t, f)
	}
	cleanupAndCheck(t, r, newFiles)
}

// TestHelmTestHook: `helm test` runs the chart's installation check in a
// pod (the controller binary with --check-install) and it passes on a
// healthy installation: DeviceClasses, the plugin's ResourceSlices, the
// Queue API and the pod webhook gating a queued pod (dry run). Chart mode
// only.
func TestHelmTestHook(t *testing.T) {
	requireChart(t, "there is no release to test")
	usePlugin(t, defaultPlugin)
	ctx := t.Context()
	startController(t)
	out, err := cluster.Helm(ctx, "test", helm.ReleaseName, "--namespace", helm.DefaultNamespace, "--logs", "--timeout", "3m")
	if err != nil {
		t.Fatalf("helm test failed: %v", err)
	}
	t.Logf("helm test:\n%s", out)
	for _, want := range []string{"Phase:          Succeeded", "ok   device classes", "ok   resource slices", "ok   queue API", "ok   pod webhook: a pod in queue default gets the tessera.dev/admission gate"} {
		if !strings.Contains(out, want) {
			t.Errorf("helm test output lacks %q", want)
		}
	}
	// Nothing of the test is left: hook-succeeded deletes its objects, the
	// dry run created no pod.
	pods, err := cluster.Client.CoreV1().Pods(helm.DefaultNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=test"})
	if err != nil || len(pods.Items) != 0 {
		t.Errorf("test pods left: %v (%v)", len(pods.Items), err)
	}
}
