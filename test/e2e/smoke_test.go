//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/test/localcluster"
)

// TestSmoke checks the cluster itself: one Ready node, the local image, and a
// plain pod that runs, echoes, and whose log comes back through the API.
func TestSmoke(t *testing.T) {
	ctx := t.Context()

	nodes, err := cluster.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing nodes: %v", err)
	}
	if len(nodes.Items) != 1 {
		t.Fatalf("want exactly one node, got %d", len(nodes.Items))
	}
	node := nodes.Items[0]
	ready := false
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			ready = true
		}
	}
	if !ready {
		t.Fatalf("node %s is not Ready: %+v", node.Name, node.Status.Conditions)
	}
	if v := node.Status.NodeInfo.KubeletVersion; v != localcluster.KubernetesVersion {
		t.Errorf("kubelet reports version %q, want %q", v, localcluster.KubernetesVersion)
	}

	// The APIs the project builds on are served: DRA (GA) and the gang
	// scheduling API, which is off unless the harness turns it on.
	for gv, kinds := range map[string][]string{
		"resource.k8s.io/v1":        {"ResourceSlice", "ResourceClaim", "ResourceClaimTemplate", "DeviceClass"},
		"scheduling.k8s.io/v1beta1": {"Workload", "PodGroup"},
	} {
		list, err := cluster.Client.Discovery().ServerResourcesForGroupVersion(gv)
		if err != nil {
			t.Errorf("%s not served: %v", gv, err)
			continue
		}
		served := map[string]bool{}
		for _, r := range list.APIResources {
			served[r.Kind] = true
		}
		for _, k := range kinds {
			if !served[k] {
				t.Errorf("%s does not serve %s", gv, k)
			}
		}
	}

	ok, err := cluster.ImagePresent(ctx, localcluster.BusyboxImage)
	if err != nil || !ok {
		t.Fatalf("%s not in containerd (err %v)", localcluster.BusyboxImage, err)
	}

	ns := newNamespace(t)
	want := fmt.Sprintf("tessera-smoke-%d", time.Now().UnixNano())
	pod := busyboxPod("echo", "sh", "-c", "echo "+want+"; ip -o link 2>/dev/null | cut -d: -f2 | tr -d ' ' | tr '\\n' ' '")
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod: %v", err)
	}
	done := waitPodPhase(t, ns, "echo", corev1.PodSucceeded, 2*time.Minute)
	if done.Spec.NodeName != node.Name {
		t.Errorf("pod ran on %q, want %q", done.Spec.NodeName, node.Name)
	}
	logs := podLogs(t, ns, "echo")
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	if len(lines) < 1 || strings.TrimSpace(lines[0]) != want {
		t.Fatalf("pod log = %q, want first line %q", logs, want)
	}
	// The network rule: pods get only their own loopback, no host interface.
	if len(lines) > 1 && strings.TrimSpace(lines[1]) != "lo" {
		t.Errorf("pod network interfaces = %q, want only lo", lines[1])
	}
}

// TestPluginRegistered checks what Up already waited for: the kubelet knows
// the driver and its ResourceSlice is published for this node.
func TestPluginRegistered(t *testing.T) {
	requirePlugin(t)
	slices, err := cluster.Client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing ResourceSlices: %v", err)
	}
	for _, s := range slices.Items {
		if s.Spec.Driver == localcluster.DriverName {
			return
		}
	}
	t.Fatalf("no ResourceSlice of %s", localcluster.DriverName)
}
