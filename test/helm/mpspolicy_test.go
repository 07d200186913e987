package helm

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/node/mps"
	"github.com/tessera-dev/tessera/pkg/node/mpspod"
)

// TestMPSDaemonPodPolicy: with kubeletPlugin.mps.mode pod the plugin's
// Role lets it create and delete pods in the release namespace; the
// admission policy lets through exactly the daemon pods that package
// mpspod builds for the plugin's own node, and refuses pods on another
// node, with another image or command, with a host path outside the MPS
// directory, privileged, or with an API token.
func TestMPSDaemonPodPolicy(t *testing.T) {
	s, ctx, admin := chartAPIServer(t)
	s.installChart(t, "--set-string", "kubeletPlugin.mpsControl=fake", "--set-string", "kubeletPlugin.mps.mode=pod",
		"--set", "webhook.enabled=false")
	ds, err := admin.AppsV1().DaemonSets(DefaultNamespace).Get(ctx, pluginName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctr := ds.Spec.Template.Spec.Containers[0]
	cfg := mpspod.Config{Namespace: DefaultNamespace, NodeName: "node-a", Image: ctr.Image, Binary: "/usr/bin/kubelet-plugin", Control: mps.FakeControl}
	for _, a := range ctr.Args {
		if v, ok := strings.CutPrefix(a, "--plugin-data-dir="); ok {
			cfg.Root = v + "/mps"
		}
		if a == "--mps-mode=pod" {
			cfg.PriorityClassName = ds.Spec.Template.Spec.PriorityClassName
		}
	}
	if cfg.Root == "" || cfg.PriorityClassName == "" {
		t.Fatalf("the DaemonSet's plugin runs with %v: want --plugin-data-dir and --mps-mode=pod", ctr.Args)
	}
	limits := mps.Limits{Devices: []mps.Device{{UUID: "GPU-1", MemMiB: 1024}}}
	const uid = "0f3c1a9e-7b2d-4c1e-9a8f-3d2b1c0e9f8a"
	daemon := func(change func(*corev1.Pod)) *corev1.Pod {
		p := cfg.Pod(uid, limits)
		change(p)
		return p
	}
	// No kube-controller-manager makes the namespace's default account.
	if _, err := admin.CoreV1().ServiceAccounts(DefaultNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	onA := s.impersonate(t, DefaultNamespace, pluginName, "node-a")
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	// The API server loads new policies within a few seconds.
	for deadline := time.Now().Add(60 * time.Second); ; {
		_, err := onA.CoreV1().Pods(DefaultNamespace).Create(ctx, daemon(func(p *corev1.Pod) { p.Spec.NodeName = "node-b" }), dryRun)
		if err != nil && strings.Contains(err.Error(), "MPS daemon pods bound to that node") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the MPS daemon pod policy is not enforced 60s after install: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}

	for _, tc := range []struct {
		name   string
		change func(*corev1.Pod)
		want   string // "" allowed
	}{
		{name: "the daemon pod package mpspod builds", change: func(*corev1.Pod) {}},
		{name: "on another node", change: func(p *corev1.Pod) { p.Spec.NodeName = "node-b" }, want: "bound to that node"},
		{name: "not bound to a node", change: func(p *corev1.Pod) { p.Spec.NodeName = "" }, want: "bound to that node"},
		{name: "without the daemon label", change: func(p *corev1.Pod) { delete(p.Labels, mpspod.ComponentLabel) }, want: "only MPS daemon pods"},
		{name: "another image", change: func(p *corev1.Pod) { p.Spec.Containers[0].Image = "evil:latest" }, want: "this chart's image"},
		{name: "another command", change: func(p *corev1.Pod) { p.Spec.Containers[0].Command = []string{"/bin/sh"} }, want: "this chart's image"},
		{name: "another subcommand", change: func(p *corev1.Pod) { p.Spec.Containers[0].Args = []string{"--kubeconfig=/x"} }, want: "this chart's image"},
		{name: "a second container", change: func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "x", Image: cfg.Image})
		}, want: "one container"},
		{name: "the host's root", change: func(p *corev1.Pod) { p.Spec.Volumes[0].HostPath.Path = "/" }, want: "mounts only its claim's MPS directory"},
		{name: "an API token", change: func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = nil }, want: "no API token"},
		{name: "host network", change: func(p *corev1.Pod) { p.Spec.HostNetwork = true }, want: "no API token, host network"},
		{name: "privileged with mock GPUs", change: func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Privileged = ptr.To(true)
			p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil
		}, want: "neither privileged"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := onA.CoreV1().Pods(DefaultNamespace).Create(ctx, daemon(tc.change), dryRun)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Error("allowed, want refused")
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Errorf("%v, want a refusal naming %q", err, tc.want)
			}
		})
	}

	// Deletes: only daemon pods of the plugin's node.
	if _, err := admin.CoreV1().Pods(DefaultNamespace).Create(ctx, daemon(func(*corev1.Pod) {}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: DefaultNamespace},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	if _, err := admin.CoreV1().Pods(DefaultNamespace).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	del := metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
	onB := s.impersonate(t, DefaultNamespace, pluginName, "node-b")
	if err := onB.CoreV1().Pods(DefaultNamespace).Delete(ctx, mpspod.PodName(uid), del); err == nil || !strings.Contains(err.Error(), "bound to that node") {
		t.Errorf("the plugin of node-b deletes node-a's daemon pod: %v, want refused", err)
	}
	if err := onA.CoreV1().Pods(DefaultNamespace).Delete(ctx, "other", del); err == nil || !strings.Contains(err.Error(), "only MPS daemon pods") {
		t.Errorf("the plugin deletes a pod that is not a daemon: %v, want refused", err)
	}
	if err := onA.CoreV1().Pods(DefaultNamespace).Delete(ctx, mpspod.PodName(uid), metav1.DeleteOptions{}); err != nil {
		t.Errorf("the plugin deletes its node's daemon pod: %v", err)
	}
	// The Role is namespaced: no pods elsewhere.
	if _, err := onA.CoreV1().Pods("default").Create(ctx, daemon(func(p *corev1.Pod) { p.Namespace = "default" }), dryRun); err == nil {
		t.Error("the plugin creates a pod outside the release namespace")
	}
}
