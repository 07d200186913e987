//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/test/localcluster"
	"github.com/tessera-dev/tessera/test/scenario"
)

// mpsRead is the line the MPS tests' containers print once they have
// printed what they see of MPS: a container on a busy node may still be
// reading when its pod is Running.
const mpsRead = "MPS-READ"

// TestMPSPerClaim: with --mps-control (the mock backend's fake daemon) two
// claims in mps mode each get their own MPS daemon with the limits set on
// the daemon side; each container sees only its own claim's pipe
// directory; deleting the pods stops the daemons and removes their
// directories.
func TestMPSPerClaim(t *testing.T) {
	usePlugin(t, localcluster.PluginConfig{Profile: localcluster.DefaultProfile, Args: []string{"--mps-control=fake"}})
	ns := newNamespace(t)
	cfg := `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","enforcement":"mps"}`
	pods := map[string]string{"mps-a": "1Gi", "mps-b": "2Gi"}
	for name, mem := range pods {
		createTemplate(t, ns, shareTemplate(name, mem, cfg))
		p := claimPod(name, name)
		// Print the variables, then what the container sees of MPS,
		// prefixed so that it is not read as variables.
		p.Spec.Containers[0].Command = []string{"sh", "-c",
			"env | grep -E 'TESSERA|CUDA|NVIDIA' | sort; ls /tmp/nvidia-mps | sed 's/^/MPS-LS: /'; " +
				"sed 's/^/MPS-CONTROL: /' /tmp/nvidia-mps/control; sed 's/^/MPS-CMD: /' /tmp/nvidia-mps/commands; echo " + mpsRead + "; exec sleep 3600"}
		createPod(t, ns, p)
	}
	r := scenario.NewRun(scenarioEnv(t), scenario.Scenario{Name: "mps"}, ns)
	if err := r.WaitPods(t.Context(), []string{"mps-a", "mps-b"}); err != nil {
		t.Fatal(err)
	}
	pls := placements(t, r)
	var files []string
	for name, mem := range pods {
		pl := pls[name]
		pl.Log = logThrough(t, ns, name, mpsRead)
		c, d := oneDevice(t, pl)
		pipe := filepath.Join(scenario.PluginDataDir, "mps", string(c.UID), "pipe")
		if pl.Env["TESSERA_MODE"] != "mps" || pl.Env["TESSERA_ENFORCED"] != "mps" || pl.Env["CUDA_MPS_PIPE_DIRECTORY"] != "/tmp/nvidia-mps" {
			t.Errorf("%s: mode %q enforced %q pipe %q", name, pl.Env["TESSERA_MODE"], pl.Env["TESSERA_ENFORCED"], pl.Env["CUDA_MPS_PIPE_DIRECTORY"])
		}
		// The daemon the container reaches is its own claim's.
		if want := "MPS-CONTROL: CUDA_MPS_PIPE_DIRECTORY=" + pipe; !strings.Contains(pl.Log, want) {
			t.Errorf("%s: the container's MPS pipe is not its claim's daemon (want %q); log:\n%s", name, want, pl.Log)
		}
		for other := range pods {
			if other == name {
				continue
			}
			oc, _ := oneDevice(t, pls[other])
			if strings.Contains(pl.Log, string(oc.UID)) {
				t.Errorf("%s: the container sees claim %s's MPS daemon; log:\n%s", name, other, pl.Log)
			}
		}
		// Daemon-side limits: the allocated memory on the claim's GPU.
		mib := map[string]int{"1Gi": 1024, "2Gi": 2048}[mem]
		if d.Memory == nil || d.Memory.Value()>>20 != int64(mib) {
			t.Errorf("%s: allocated memory %v, want %dMi", name, d.Memory, mib)
		}
		want := fmt.Sprintf("MPS-CMD: set_default_device_pinned_mem_limit %s %dM", d.Attributes["uuid"], mib)
		if !strings.Contains(pl.Log, want) {
			t.Errorf("%s: daemon commands lack %q; log:\n%s", name, want, pl.Log)
		}
		// Only one MPS mount, from the claim's own pipe directory.
		_, spec := claimSpecFile(t, c.UID)
		var mounts []string
		for _, m := range spec.ContainerEdits.Mounts {
			if m.ContainerPath == "/tmp/nvidia-mps" {
				mounts = append(mounts, m.HostPath)
			}
		}
		if len(mounts) != 1 || mounts[0] != pipe {
			t.Errorf("%s: MPS mounts %v, want only %s", name, mounts, pipe)
		}
		files = append(files, hostFilesOfClaim(t, c.UID)...)
		files = append(files, filepath.Join(pipe, "control"))
	}
	// Unprepare quits each daemon (the fake removes its control file) and
	// removes its directories.
	cleanupAndCheck(t, r, files)
}

// mpsPodPlugin runs the per-claim MPS daemons (the mock's fake daemon) in
// pods of their own.
var mpsPodPlugin = localcluster.PluginConfig{Profile: localcluster.DefaultProfile, Args: []string{"--mps-control=fake", "--mps-mode=pod"}}

// TestMPSDaemonPods: with kubeletPlugin.mps.mode pod a claim in mps mode
// gets a daemon pod of its own in the plugin's namespace, bound to the
// node, with the limits set on the daemon side; the claim's container
// reaches that daemon through its own pipe directory. A `helm upgrade` of
// the plugin (MPS pod mode on) and then a crash of the plugin's pod (deleted
// without grace) leave the daemon pod (same UID, no restart) and the
// tenant's container running; the restarted plugin adopts it and prepares
// a new claim; deleting the tenant pods deletes their daemon pods and
// directories. Chart mode only.
func TestMPSDaemonPods(t *testing.T) {
	requireChart(t, "daemon pods run the chart's image")
	usePlugin(t, mpsPodPlugin)
	ctx := t.Context()
	ns := newNamespace(t)
	cfg := `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","enforcement":"mps"}`
	createTemplate(t, ns, shareTemplate("mps", "1Gi", cfg))
	tenant := func(name string) *corev1.Pod {
		p := claimPod(name, "mps")
		// What the container sees of MPS, then: is its daemon still there?
		p.Spec.Containers[0].Command = []string{"sh", "-c",
			"env | grep -E 'TESSERA|CUDA|NVIDIA' | sort; sed 's/^/MPS-CONTROL: /' /tmp/nvidia-mps/control; sed 's/^/MPS-CMD: /' /tmp/nvidia-mps/commands; echo " + mpsRead + "; " +
				"while test -e /tmp/nvidia-mps/control; do sleep 1; done; echo MPS-GONE; exec sleep 3600"}
		return p
	}
	createPod(t, ns, tenant("a"))
	r := scenario.NewRun(scenarioEnv(t), scenario.Scenario{Name: "mps-daemon-pods"}, ns)
	if err := r.WaitPods(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	plugin, err := cluster.PluginPod(ctx)
	if err != nil || plugin == nil {
		t.Fatalf("the plugin's pod: %v", err)
	}
	pods := cluster.Client.CoreV1().Pods(plugin.Namespace)
	pl := placements(t, r)["a"]
	pl.Log = logThrough(t, ns, "a", mpsRead)
	c, d := oneDevice(t, pl)
	pipe := filepath.Join(scenario.PluginDataDir, "mps", string(c.UID), "pipe")
	daemonName := "tessera-mps-" + string(c.UID)
	daemon, err := pods.Get(ctx, daemonName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the claim's MPS daemon pod: %v", err)
	}
	if daemon.Spec.NodeName != plugin.Spec.NodeName || daemon.Status.Phase != corev1.PodRunning || len(daemon.OwnerReferences) != 0 {
		t.Errorf("daemon pod on %q phase %s owners %v: want running on the plugin's node %q, owned by nobody", daemon.Spec.NodeName, daemon.Status.Phase, daemon.OwnerReferences, plugin.Spec.NodeName)
	}
	if want := "MPS-CONTROL: CUDA_MPS_PIPE_DIRECTORY=" + pipe; !strings.Contains(pl.Log, want) {
		t.Errorf("the container's MPS pipe is not its claim's daemon (want %q); log:\n%s", want, pl.Log)
	}
	if want := fmt.Sprintf("MPS-CMD: set_default_device_pinned_mem_limit %s 1024M", d.Attributes["uuid"]); !strings.Contains(pl.Log, want) {
		t.Errorf("daemon commands lack %q; log:\n%s", want, pl.Log)
	}
	_, spec := claimSpecFile(t, c.UID)
	for _, m := range spec.ContainerEdits.Mounts {
		if m.ContainerPath == "/tmp/nvidia-mps" && m.HostPath != pipe {
			t.Errorf("MPS mount from %s, want only %s", m.HostPath, pipe)
		}
	}
	tenantContainer := pl.Pod.Status.ContainerStatuses[0].ContainerID
	untouched := func(when string) {
		t.Helper()
		got, err := pods.Get(ctx, daemonName, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: the daemon pod: %v", when, err)
		}
		if cs := got.Status.ContainerStatuses; got.UID != daemon.UID || got.Status.Phase != corev1.PodRunning || len(cs) != 1 || cs[0].RestartCount != 0 || cs[0].State.Running == nil {
			t.Errorf("%s: daemon pod %s phase %s statuses %+v; want the same pod (%s) running, not restarted", when, got.UID, got.Status.Phase, cs, daemon.UID)
		}
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].State.Running == nil || cs[0].ContainerID != tenantContainer || cs[0].RestartCount != 0 {
			t.Errorf("%s: tenant container %+v; want %s still running", when, cs, tenantContainer)
		}
		checkPresent(t, filepath.Join(pipe, "control"))
		if strings.Contains(podLogs(t, ns, "a"), "MPS-GONE") {
			t.Errorf("%s: the tenant lost its MPS daemon", when)
		}
	}

	// helm upgrade with MPS pod mode on: the DaemonSet replaces the plugin.
	upgraded := localcluster.PluginConfig{Profile: mpsPodPlugin.Profile, Args: append(slices.Clone(mpsPodPlugin.Args), "-v=5")}
	if err := cluster.UpgradePlugin(ctx, upgraded); err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	waitFor(t, 90*time.Second, "the old plugin pod "+plugin.Name+" gone", func(ctx context.Context) (bool, error) {
		_, err := pods.Get(ctx, plugin.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	untouched("after helm upgrade")

	// A crash: the plugin's pod goes without a grace period.
	crashed, err := cluster.PluginPod(ctx)
	if err != nil || crashed == nil {
		t.Fatalf("the plugin's pod after the upgrade: %v", err)
	}
	if err := pods.Delete(ctx, crashed.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "a new, ready plugin pod", func(ctx context.Context) (bool, error) {
		p, err := cluster.PluginPod(ctx)
		if err != nil || p == nil || p.UID == crashed.UID {
			return false, nil
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	untouched("after the plugin's pod was deleted without grace")

	// The restarted plugin prepares a new claim with a daemon of its own.
	createPod(t, ns, tenant("b"))
	if err := r.WaitPods(ctx, []string{"b"}); err != nil {
		t.Fatalf("a new claim after the plugin restarted: %v", err)
	}
	cb, _ := oneDevice(t, placements(t, r)["b"])
	if _, err := pods.Get(ctx, "tessera-mps-"+string(cb.UID), metav1.GetOptions{}); err != nil {
		t.Errorf("the new claim's daemon pod: %v", err)
	}
	untouched("after a second claim")

	// Unprepare deletes each daemon pod and its directories.
	files := []string{filepath.Join(pipe, "control"), filepath.Dir(pipe)}
	files = append(files, hostFilesOfClaim(t, c.UID)...)
	files = append(files, hostFilesOfClaim(t, cb.UID)...)
	cleanupAndCheck(t, r, files)
	for _, uid := range []string{string(c.UID), string(cb.UID)} {
		if _, err := pods.Get(ctx, "tessera-mps-"+uid, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("daemon pod of claim %s after unprepare: %v", uid, err)
		}
	}
}
