//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/test/helm"
	"github.com/tessera-dev/tessera/test/localcluster"
)

// canaryDeployment is the chart's canary controller (controller.canary.enabled).
const canaryDeployment = localcluster.ChartController + "-canary"

// setCanary turns the chart's canary controller on or off (`helm upgrade
// --reuse-values`), and waits until its Deployment is available or gone.
func setCanary(t *testing.T, ctx context.Context, on bool) {
	t.Helper()
	out, err := cluster.Helm(ctx, "upgrade", helm.ReleaseName, filepath.Join(cluster.Opts.RepoRoot, helm.ChartPath),
		"--kubeconfig", cluster.Kubeconfig, "--namespace", localcluster.ChartNamespace, "--reuse-values",
		"--set", fmt.Sprintf("controller.canary.enabled=%v", on), "--timeout", "3m")
	if err != nil {
		t.Fatalf("helm upgrade --set controller.canary.enabled=%v: %v\n%s", on, err, out)
	}
	waitFor(t, 2*time.Minute, fmt.Sprintf("canary Deployment (enabled=%v)", on), func(ctx context.Context) (bool, error) {
		d, err := cluster.Client.AppsV1().Deployments(localcluster.ChartNamespace).Get(ctx, canaryDeployment, metav1.GetOptions{})
		if !on {
			return err != nil, nil
		}
		if err != nil {
			return false, err
		}
		return d.Status.ObservedGeneration >= d.Generation && d.Status.AvailableReplicas == 1 && d.Status.UpdatedReplicas == 1,
			fmt.Errorf("status %+v", d.Status)
	})
}

// TestCanaryQueues runs the main controller and a canary release of it
// (the chart's controller.canary.enabled, --controller-name=canary) side by side.
// A queue tree moves to the canary with one field on its root
// (spec.controllerName) and back (the rollback): each time its gated pods
// are admitted by the tree's controller of the moment, as the pods'
// tessera.dev/admitted-by says, and the pods already running are never
// touched (same UID, no restart, admitted-by unchanged). A child queue
// that names the other controller is refused with a condition; a tree
// that names a controller nobody runs keeps its pods gated (no one else
// decides them) until it is moved back.
func TestCanaryQueues(t *testing.T) {
	requireChart(t, "the canary controller is a chart value (controller.canary.enabled): needs TESSERA_INSTALL=chart")
	usePlugin(t, defaultPlugin)
	ctx := t.Context()
	startController(t)
	setCanary(t, ctx, true)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		setCanary(t, ctx, false)
	})
	applyYAML(t, `apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: canary-root}
---
apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: canary-a}
spec:
  parent: canary-root
  resources:
    gpu.tessera.dev/memory: {quota: 8Gi, limit: 8Gi}
`)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := cluster.Kubectl(ctx, "delete", "queues", "canary-a", "canary-b", "--ignore-not-found", "--wait"); err != nil {
			t.Logf("deleting the queues: %v: %s", err, out)
		}
		_, _ = cluster.Kubectl(ctx, "delete", "queue", "canary-root", "--ignore-not-found")
	})
	ns := newNamespace(t)
	createTemplate(t, ns, shareTemplate("share-1gi", "1Gi", ""))
	start := func(name string) {
		t.Helper()
		p := claimPod(name, "share-1gi")
		p.Labels = map[string]string{v1alpha1.QueueLabel: "canary-a"}
		createPod(t, ns, p)
	}
	admittedBy := func(name, want string) *corev1.Pod {
		t.Helper()
		var pod *corev1.Pod
		waitFor(t, 2*time.Minute, "pod "+name+" admitted by "+want+" and running", func(ctx context.Context) (bool, error) {
			p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			pod = p
			by := p.Annotations[v1alpha1.AdmittedByAnnotation]
			if by != "" && by != want {
				return false, fmt.Errorf("admitted by %q, want %q", by, want)
			}
			return by == want && p.Status.Phase == corev1.PodRunning,
				fmt.Errorf("gated %v, admitted by %q, phase %s, condition %q", gated(p), by, p.Status.Phase, admissionMessage(p))
		})
		if by := pod.Annotations[v1alpha1.AdmittedByAnnotation]; by != want {
			t.Fatalf("pod %s admitted by %q, want %q", name, by, want)
		}
		return pod
	}
	move := func(controllerName string) {
		t.Helper()
		v := "null"
		if controllerName != "" {
			v = fmt.Sprintf("%q", controllerName)
		}
		if out, err := cluster.Kubectl(ctx, "patch", "queue", "canary-root", "--type=merge", "-p", `{"spec":{"controllerName":`+v+`}}`); err != nil {
			t.Fatalf("moving canary-root to %q: %v: %s", controllerName, err, out)
		}
	}
	assigned := func(queue string, status metav1.ConditionStatus, reason, message string) {
		t.Helper()
		waitFor(t, time.Minute, "queue "+queue+" condition ControllerAssigned "+reason, func(ctx context.Context) (bool, error) {
			out, err := cluster.Kubectl(ctx, "get", "queue", queue, "-o", "json")
			if err != nil {
				return false, fmt.Errorf("%v: %s", err, out)
			}
			var q v1alpha1.Queue
			if err := json.Unmarshal([]byte(out), &q); err != nil {
				return false, err
			}
			c := meta.FindStatusCondition(q.Status.Conditions, v1alpha1.QueueConditionControllerAssigned)
			if c == nil {
				return false, fmt.Errorf("no condition")
			}
			return c.Status == status && c.Reason == reason && strings.Contains(c.Message, message) && c.ObservedGeneration == q.Generation,
				fmt.Errorf("%s %s: %s (generation %d, observed %d)", c.Status, c.Reason, c.Message, q.Generation, c.ObservedGeneration)
		})
	}

	// The main controller decides the tree.
	start("main-1")
	running := map[string]*corev1.Pod{"main-1": admittedBy("main-1", v1alpha1.DefaultControllerName)}
	assigned("canary-a", metav1.ConditionTrue, v1alpha1.ReasonControllerAssigned, `"default"`)

	// One field moves it to the canary: new pods are the canary's, the
	// canary writes the queues' status, main-1 runs on.
	move("canary")
	assigned("canary-a", metav1.ConditionTrue, v1alpha1.ReasonControllerAssigned, `"canary"`)
	start("canary-1")
	running["canary-1"] = admittedBy("canary-1", "canary")

	// A child cannot take its parent's tree apart.
	applyYAML(t, `apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: canary-b}
spec:
  parent: canary-root
  controllerName: default
`)
	assigned("canary-b", metav1.ConditionFalse, v1alpha1.ReasonSplitRefused, "set spec.controllerName on canary-root")

	// A tree no running controller owns: its gated pod is nobody else's.
	move("nobody")
	time.Sleep(3 * time.Second) // both controllers see the move
	start("waits-1")
	time.Sleep(10 * time.Second) // several cycles of both
	p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "waits-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !gated(p) || p.Annotations[v1alpha1.AdmittedByAnnotation] != "" || admissionMessage(p) != "" {
		t.Fatalf("waits-1 in a tree of controller \"nobody\" was decided: gated %v, admitted by %q, condition %q",
			gated(p), p.Annotations[v1alpha1.AdmittedByAnnotation], admissionMessage(p))
	}

	// The rollback: the field removed, the main controller decides the
	// waiting pod within a cycle.
	move("")
	admittedBy("waits-1", v1alpha1.DefaultControllerName)
	assigned("canary-a", metav1.ConditionTrue, v1alpha1.ReasonControllerAssigned, `"default"`)
	start("main-2")
	admittedBy("main-2", v1alpha1.DefaultControllerName)

	// Nothing that ran was disturbed by the moves.
	for name, before := range running {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod %s: %v", name, err)
		}
		if p.UID != before.UID || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			t.Errorf("pod %s was disturbed: UID %s (was %s), deleting %v, phase %s", name, p.UID, before.UID, p.DeletionTimestamp != nil, p.Status.Phase)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount != 0 {
				t.Errorf("pod %s: container %s restarted %d times", name, cs.Name, cs.RestartCount)
			}
		}
		if a, b := p.Annotations[v1alpha1.AdmittedByAnnotation], before.Annotations[v1alpha1.AdmittedByAnnotation]; a != b {
			t.Errorf("pod %s: admitted-by changed from %q to %q", name, b, a)
		}
		if a, b := p.Annotations[v1alpha1.AdmittedAtAnnotation], before.Annotations[v1alpha1.AdmittedAtAnnotation]; a != b {
			t.Errorf("pod %s admitted again: admitted-at %q, was %q", name, a, b)
		}
	}
	logControllerEvents(t, ctx, ns)
}

// logControllerEvents logs which controller reported each pod's Admitted
// event (the canary's events come from tessera-controller-canary).
func logControllerEvents(t *testing.T, ctx context.Context, ns string) {
	t.Helper()
	evs, err := cluster.Client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("listing events: %v", err)
		return
	}
	for _, e := range evs.Items {
		if e.Reason == "Admitted" {
			t.Logf("Admitted %s by %s: %s", e.Regarding.Name, e.ReportingController, e.Note)
		}
	}
}
