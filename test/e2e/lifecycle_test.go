//go:build e2e

package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/test/scenario"
)

// TestPluginCrash: SIGKILL the kubelet plugin while pods hold claims. The
// running pods keep running (same containers, no restart); after the plugin
// restarts a new pod still prepares; deleting the old pods unprepares their
// claims cleanly.
//
// Host mode: the plugin process is killed and the test restarts it. Chart
// mode: the process of the DaemonSet pod's container is killed (by PID,
// found through containerd) and the kubelet restarts the container in the
// same pod, which must register the driver again.
func TestPluginCrash(t *testing.T) {
	usePlugin(t, defaultPlugin)
	ns := newNamespace(t)
	createTemplate(t, ns, shareTemplate("share-1gi", "1Gi", `{"apiVersion":"tessera.dev/v1alpha1","enforcement":"interposer","kind":"GpuConfig"}`))
	for _, n := range []string{"old-1", "old-2"} {
		createPod(t, ns, claimPod(n, "share-1gi"))
	}
	r := scenario.NewRun(scenarioEnv(t), scenario.Scenario{Name: "plugin-crash"}, ns)
	if err := r.WaitPods(t.Context(), []string{"old-1", "old-2"}); err != nil {
		t.Fatal(err)
	}
	before := placements(t, r)
	var oldFiles []string
	containers := map[string]string{}
	for _, n := range []string{"old-1", "old-2"} {
		pl := before[n]
		c, d := oneDevice(t, pl)
		checkEnv(t, ns, pl, envWant{mode: "interposer", enforced: "advisory", uuid: d.Attributes["uuid"]})
		oldFiles = append(oldFiles, hostFilesOfClaim(t, c.UID)...)
		containers[n] = pl.Pod.Status.ContainerStatuses[0].ContainerID
	}

	cfg := cluster.Plugin()
	var pluginPod *corev1.Pod
	if cluster.ChartMode() {
		p, err := cluster.PluginPod(t.Context())
		if err != nil || p == nil {
			t.Fatalf("the plugin's DaemonSet pod: %v", err)
		}
		pluginPod = p
	}
	if err := cluster.KillPlugin(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !cluster.PluginRunning() {
			_ = cluster.StartPluginWith(context.Background(), cfg)
		}
	})
	if pluginPod != nil {
		// KillPlugin waited for the kubelet to restart the container and
		// re-register the driver: same pod, one more restart.
		p, err := cluster.PluginPod(t.Context())
		if err != nil || p == nil {
			t.Fatalf("the plugin's DaemonSet pod after the kill: %v", err)
		}
		if p.UID != pluginPod.UID {
			t.Errorf("the plugin's pod was replaced (%s -> %s); the kubelet should have restarted its container", pluginPod.Name, p.Name)
		}
		restarts := func(p *corev1.Pod) int32 {
			for _, cs := range p.Status.ContainerStatuses {
				if cs.Name == "kubelet-plugin" {
					return cs.RestartCount
				}
			}
			return -1
		}
		if got, was := restarts(p), restarts(pluginPod); got != was+1 {
			t.Errorf("plugin container restartCount %d after the kill, want %d", got, was+1)
		}
	}
	// Give the kubelet time to notice; the pods must not care.
	time.Sleep(5 * time.Second)
	checkStillRunning := func(when string) {
		t.Helper()
		for n, id := range containers {
			p, err := cluster.Client.CoreV1().Pods(ns).Get(t.Context(), n, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("%s: %v", when, err)
			}
			cs := p.Status.ContainerStatuses
			if p.Status.Phase != corev1.PodRunning || len(cs) != 1 || cs[0].State.Running == nil || cs[0].ContainerID != id || cs[0].RestartCount != 0 {
				t.Errorf("%s: pod %s is %s, container %+v; want the same container (%s) still running", when, n, p.Status.Phase, cs, id)
			}
		}
	}
	checkStillRunning("after the plugin was killed")
	for _, f := range oldFiles {
		checkPresent(t, f)
	}

	if !cluster.ChartMode() {
		// A host process has no supervisor: restart it as one would.
		if err := cluster.StartPluginWith(t.Context(), cfg); err != nil {
			t.Fatalf("restarting the plugin: %v", err)
		}
	}
	checkStillRunning("after the plugin restarted")

	createPod(t, ns, claimPod("new", "share-1gi"))
	if err := r.WaitPods(t.Context(), []string{"new"}); err != nil {
		t.Fatalf("a new pod after the restart: %v", err)
	}
	after := placements(t, r)
	c, d := oneDevice(t, after["new"])
	checkEnv(t, ns, after["new"], envWant{mode: "interposer", enforced: "advisory", uuid: d.Attributes["uuid"]})
	newFiles := hostFilesOfClaim(t, c.UID)

	// The old pods' claims, prepared by the killed instance, unprepare cleanly.
	for _, n := range []string{"old-1", "old-2"} {
		if err := r.DeletePod(t.Context(), n, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	checkGone(t, "after deleting the pods prepared before the crash", oldFiles)
	for _, f := range newFiles {
		checkPresent(t, f)
	}
	cleanupAndCheck(t, r, newFiles)
}

func checkPresent(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Stat(p); err != nil {
		t.Errorf("%s is gone but its claim is still prepared: %v", p, err)
	}
}

// TestInvalidOpaqueConfig: a claim whose opaque GpuConfig has a bad value or
// an unknown field never starts its pod, and the pod's events name the
// field; a valid pod next to it starts.
func TestInvalidOpaqueConfig(t *testing.T) {
	usePlugin(t, defaultPlugin)
	ns := newNamespace(t)
	cases := []struct{ pod, config, field string }{
		{"bad-value", `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","enforcement":"strict"}`, "enforcement"},
		{"unknown-field", `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","memoryLimit":"1Gi"}`, "memoryLimit"},
	}
	for _, c := range cases {
		createTemplate(t, ns, shareTemplate(c.pod, "1Gi", c.config))
		createPod(t, ns, claimPod(c.pod, c.pod))
	}
	createTemplate(t, ns, shareTemplate("good", "1Gi", `{"apiVersion":"tessera.dev/v1alpha1","enforcement":"none","kind":"GpuConfig"}`))
	createPod(t, ns, claimPod("good", "good"))

	r := scenario.NewRun(scenarioEnv(t), scenario.Scenario{Name: "invalid-config"}, ns)
	for _, c := range cases {
		r.Expect[c.pod] = corev1.PodPending
	}
	waitPodPhase(t, ns, "good", corev1.PodRunning, 2*time.Minute)

	for _, c := range cases {
		var msg string
		waitFor(t, 90*time.Second, "an event of pod "+c.pod+" naming "+c.field, func(ctx context.Context) (bool, error) {
			for _, e := range podEvents(ctx, ns, c.pod) {
				if e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, c.field) {
					msg = e.Reason + ": " + e.Message
					return true, nil
				}
			}
			return false, nil
		})
		t.Logf("%s: %s", c.pod, msg)
		p, err := cluster.Client.CoreV1().Pods(ns).Get(t.Context(), c.pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase != corev1.PodPending {
			t.Errorf("%s is %s, want Pending (its claim must not prepare)", c.pod, p.Status.Phase)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running != nil || cs.State.Terminated != nil {
				t.Errorf("%s: container %s started: %+v", c.pod, cs.Name, cs.State)
			}
		}
	}
	pls := placements(t, r)
	c, d := oneDevice(t, pls["good"])
	checkEnv(t, ns, pls["good"], envWant{mode: "none", enforced: "advisory", uuid: d.Attributes["uuid"]})
	files := hostFilesOfClaim(t, c.UID)
	// The failed claims left nothing on the node.
	for _, name := range []string{"bad-value", "unknown-field"} {
		for _, cl := range pls[name].Claims {
			if left := scenario.ClaimFiles(cl.UID); len(left) > 0 {
				t.Errorf("claim %s failed to prepare but left %v", cl.Name, left)
			}
		}
	}
	cleanupAndCheck(t, r, files)
}

// TestPendingUntilCapacityFrees: with both T4s holding an 8000Mi share, a
// third 8000Mi share fits nowhere: its pod stays Pending with the
// scheduler's reason, and starts as soon as one share is freed.
func TestPendingUntilCapacityFrees(t *testing.T) {
	usePlugin(t, defaultPlugin)
	ns := newNamespace(t)
	createTemplate(t, ns, shareTemplate("share-8000mi", "8000Mi", ""))
	r := scenario.NewRun(scenarioEnv(t), scenario.Scenario{Name: "pending"}, ns)
	for _, n := range []string{"first", "second"} {
		createPod(t, ns, claimPod(n, "share-8000mi"))
		if err := r.WaitPods(t.Context(), []string{n}); err != nil {
			t.Fatal(err)
		}
	}
	createPod(t, ns, claimPod("third", "share-8000mi"))
	r.Expect["third"] = corev1.PodPending
	if err := r.WaitPods(t.Context(), []string{"third"}); err != nil {
		t.Fatal(err)
	}
	pls := placements(t, r)
	_, d1 := oneDevice(t, pls["first"])
	_, d2 := oneDevice(t, pls["second"])
	if d1.Name == d2.Name {
		t.Errorf("first and second share %s: 2 x 8000Mi cannot fit one T4's 15104Mi", d1.Name)
	}
	reason := scenario.PendingReason(pls["third"].Pod)
	if !strings.HasPrefix(reason, corev1.PodReasonUnschedulable+": ") || !strings.Contains(reason, "claim") {
		t.Errorf("third: scheduler's verdict %q, want Unschedulable naming the claims", reason)
	}
	// It stays Pending while nothing changes.
	time.Sleep(3 * time.Second)
	if p, err := cluster.Client.CoreV1().Pods(ns).Get(t.Context(), "third", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Fatalf("third was scheduled although nothing was freed (err %v)", err)
	}
	start := time.Now()
	if err := r.DeletePod(t.Context(), "first", time.Minute); err != nil {
		t.Fatal(err)
	}
	delete(r.Expect, "third")
	if err := r.WaitPods(t.Context(), []string{"third"}); err != nil {
		t.Fatalf("third did not start after first was deleted: %v", err)
	}
	t.Logf("third started %.1fs after first was deleted", time.Since(start).Seconds())
	pls = readPlacements(t, r, false)
	c, d := oneDevice(t, pls["third"])
	if d.Name != d1.Name {
		t.Errorf("third landed on %s, want %s (the GPU first freed)", d.Name, d1.Name)
	}
	checkEnv(t, ns, pls["third"], envWant{mode: "none", enforced: "advisory", uuid: d.Attributes["uuid"]})
	cleanupAndCheck(t, r, hostFilesOfClaim(t, c.UID))
}

// TestClaimStatusReportsDevices: the plugin reports each prepared device in
// the claim's status.devices (UUID, memory limit, enforcement), whatever the
// key order of the claim's opaque parameters. kubectl sends them with
// sorted keys; a Go client marshalling a GpuConfig sends apiVersion, kind,
// enforcement — both must work.
func TestClaimStatusReportsDevices(t *testing.T) {
	usePlugin(t, defaultPlugin)
	ns := newNamespace(t)
	configs := map[string]string{
		"sorted-keys":     `{"apiVersion":"tessera.dev/v1alpha1","enforcement":"none","kind":"GpuConfig"}`,
		"go-struct-order": `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","enforcement":"none"}`,
	}
	for name, cfg := range configs {
		createTemplate(t, ns, shareTemplate(name, "1Gi", cfg))
		createPod(t, ns, claimPod(name, name))
	}
	r := scenario.NewRun(scenarioEnv(t), scenario.Scenario{Name: "status"}, ns)
	if err := r.WaitPods(t.Context(), []string{"sorted-keys", "go-struct-order"}); err != nil {
		t.Fatal(err)
	}
	pls := placements(t, r)
	var files []string
	for name := range configs {
		c, d := oneDevice(t, pls[name])
		checkEnv(t, ns, pls[name], envWant{mode: "none", enforced: "advisory", uuid: d.Attributes["uuid"]})
		files = append(files, hostFilesOfClaim(t, c.UID)...)
	}
	cleanupAndCheck(t, r, files)
}
