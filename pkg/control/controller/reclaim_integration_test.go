package controller_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/test/testutil"
)

// run plays kube-scheduler and the kubelet for an admitted pod: its claim
// allocated on the node, the pod bound and Running and Ready (so that a
// PodDisruptionBudget guards it: the Eviction API ignores budgets for
// pending pods).
func (e *env) run(name, node string, slices []*resourceapi.ResourceSlice) {
	e.t.Helper()
	e.allocate(node, slices, name+"-gpu")
	p := e.pod(name)
	if err := e.c.SubResource("binding").Create(e.ctx, p, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}); err != nil {
		e.t.Fatal(err)
	}
	p = e.pod(name)
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
	if err := e.c.Status().Update(e.ctx, p); err != nil {
		e.t.Fatal(err)
	}
}

// budget guards the pods labelled app=<app> with a PodDisruptionBudget
// that allows no disruption. envtest runs no disruption controller, so its
// status is never computed and the Eviction API refuses every eviction of
// a pod it selects with a 429 (DisruptionBudget cause), as it does for a
// budget at its limit.
func (e *env) budget(app string) {
	e.t.Helper()
	e.create(&policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: app},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: ptr.To(intstr.FromInt32(0)),
			Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
		},
	})
}

// TestReclaimEvictions runs reclaim against a real API server (its
// Eviction API and budgets): a victim's 600 s grace period is cut to the
// reclaim grace period; a victim whose budget refuses its eviction is
// passed over for another; when only budget-protected victims make room,
// one is deleted past its budget (--reclaim-past-budgets); and with
// budgets honoured, the refused reclaim holds nothing.
func TestReclaimEvictions(t *testing.T) {
	for _, tc := range []struct {
		name        string
		pastBudgets bool
		budgets     []string
		// want: the victim that ends up deleted ("" for none) and a-0's
		// condition.
		deleted, reason, message string
	}{
		{"a budget on the newest victim: the other goes", true, []string{"b-1"}, "b-0", decide.ReasonReclaiming, "waiting for evicted workloads to end: pod b-0 (queue team-b), due to end by"},
		{"budgets on both, passed", true, []string{"b-0", "b-1"}, "b-1", decide.ReasonReclaiming, "due to end by"},
		{"budgets on both, honoured", false, []string{"b-0", "b-1"}, "", decide.ReasonDoesNotFit, "reclaim passes over over-quota workloads whose eviction was refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEnv(t)
			e.opts.ReclaimPastBudgets = tc.pastBudgets
			slices := e.gpuNode("node-1", "h100-80gb:2")
			e.create(decidetest.Queue("team-a", "", "80Gi", ""), decidetest.Queue("team-b", "", "", ""))
			e.startController()
			// team-b (no quota) runs b-0, then b-1, a whole GPU each;
			// b-0's own grace period is 600 s.
			for _, n := range []string{"b-0", "b-1"} {
				e.create(claim(n+"-gpu", decidetest.Request{}))
				p := asNew(claimPod(n, "team-b", n+"-gpu"))
				p.Labels["app"] = n
				if n == "b-0" {
					p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](600)
				}
				e.create(p)
				e.waitAdmitted(n)
				e.run(n, "node-1", slices)
			}
			for _, b := range tc.budgets {
				e.budget(b)
			}
			e.create(claim("a-0-gpu", decidetest.Request{}))
			e.create(asNew(claimPod("a-0", "team-a", "a-0-gpu")))
			// Refusals take a cycle each: more time than waitWaiting's on a
			// loaded machine.
			e.waitCondition("a-0", tc.reason, tc.message, 2*time.Minute)
			e.waitWaiting("a-0", tc.reason, tc.message)
			// The newest victim first: b-1's eviction was tried, and its
			// budget refused it.
			e.waitEvent("b-1", ReasonEvictionRefusedForTest, "disruption budget")
			for _, n := range []string{"b-0", "b-1"} {
				p := e.pod(n)
				switch {
				case n == tc.deleted && p.DeletionTimestamp == nil:
					t.Errorf("%s is not being deleted", n)
				case n == tc.deleted && ptr.Deref(p.DeletionGracePeriodSeconds, -1) != 30:
					t.Errorf("%s deleted with a grace period of %d s, want 30 (the reclaim grace period; its own is %d)", n, ptr.Deref(p.DeletionGracePeriodSeconds, -1), ptr.Deref(p.Spec.TerminationGracePeriodSeconds, 30))
				case n != tc.deleted && p.DeletionTimestamp != nil:
					t.Errorf("%s is being deleted, want only %q", n, tc.deleted)
				}
			}
		})
	}
}

// ReasonEvictionRefusedForTest is controller.ReasonEvictionRefused, kept
// literal: the event reason is a contract with users' alerts.
const ReasonEvictionRefusedForTest = "EvictionRefused"

// waitCondition waits up to timeout for the pod's admission condition to
// have reason and a message containing message.
func (e *env) waitCondition(name, reason, message string, timeout time.Duration) {
	e.t.Helper()
	var c *corev1.PodCondition
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if c = condition(e.pod(name)); c != nil && c.Reason == reason && strings.Contains(c.Message, message) {
			return
		}
	}
	e.t.Fatalf("pod %s: condition %+v after %s, want %s %q", name, c, timeout, reason, message)
}

func (e *env) waitEvent(name, reason, message string) {
	e.t.Helper()
	testutil.Eventually(e.t, 30*time.Second, fmt.Sprintf("event %s on %s", reason, name), func() error {
		var evs eventsv1.EventList
		if err := e.c.List(e.ctx, &evs, client.InNamespace("default")); err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Regarding.Name == name && ev.Reason == reason && strings.Contains(ev.Note, message) {
				return nil
			}
		}
		return fmt.Errorf("no event %s %q on %s among %d", reason, message, name, len(evs.Items))
	})
}
