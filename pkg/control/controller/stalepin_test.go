package controller_test

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/pkg/control/controller"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/test/testutil"
)

// TestStalePinReplaced, against a real kube-apiserver: every admitted pod
// is pinned by node affinity on metadata.name in the patch that removes
// its gate (the API accepts it on a gated pod); a pinned pod the scheduler
// reports Unschedulable past --stale-pin-grace, and one whose node is
// deleted, are evicted with a StalePin event (their owner, or the user for
// a bare pod, creates them again).
func TestStalePinReplaced(t *testing.T) {
	e := startEnv(t)
	e.opts.PinNodes = controller.PinAll
	e.opts.StalePinGrace = 2 * time.Second
	e.opts.ReplaceStalePins = true
	e.gpuNode("node-1", "h100-80gb:8")
	e.create(decidetest.Queue("team", "", "", ""))
	e.startController()
	defer e.stopController()

	for _, n := range []string{"stuck", "orphan"} {
		e.create(claim(n+"-gpu", decidetest.Request{Memory: "4Gi"}))
		e.create(asNew(claimPod(n, "team", n+"-gpu")))
	}
	e.waitAdmitted("stuck", "orphan")
	for _, n := range []string{"stuck", "orphan"} {
		if p := e.pod(n); pinnedTo(p) != "node-1" || p.Annotations[controller.PinnedAnnotation] != "node-1" {
			t.Fatalf("%s not pinned to node-1: affinity %+v, annotations %v", n, p.Spec.Affinity, p.Annotations)
		}
	}
	gone := func(name string) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, name+" deleted for its stale pin", func() error {
			var p corev1.Pod
			err := e.c.Get(e.ctx, client.ObjectKey{Namespace: "default", Name: name}, &p)
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("still there: %v %+v", err, p.Status.Conditions)
		})
		testutil.Eventually(t, 30*time.Second, name+" StalePin event", func() error {
			var evs eventsv1.EventList
			if err := e.c.List(e.ctx, &evs, client.InNamespace("default")); err != nil {
				return err
			}
			for _, ev := range evs.Items {
				if ev.Regarding.Name == name && ev.Reason == controller.ReasonStalePin {
					return nil
				}
			}
			return fmt.Errorf("no StalePin event for %s", name)
		})
	}

	// The scheduler found no room on the pinned node a minute ago.
	// The scheduler replaces the pod's PodScheduled condition (it was
	// SchedulingGated while the pod waited).
	p := e.pod("stuck")
	unschedulable := corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: corev1.PodReasonUnschedulable, Message: "0/1 nodes are available: 1 Insufficient cpu.", LastTransitionTime: metav1.NewTime(time.Now().Add(-time.Minute))}
	replaced := false
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodScheduled {
			p.Status.Conditions[i], replaced = unschedulable, true
		}
	}
	if !replaced {
		p.Status.Conditions = append(p.Status.Conditions, unschedulable)
	}
	if err := e.c.Status().Update(e.ctx, p); err != nil {
		t.Fatal(err)
	}
	gone("stuck")
	if e.pod("orphan") == nil {
		t.Fatal("orphan replaced with a healthy pin")
	}

	// The pinned node is deleted.
	if err := e.c.Delete(e.ctx, decidetest.Node("node-1")); err != nil {
		t.Fatal(err)
	}
	gone("orphan")
}
