package controller_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/pkg/control/decide"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/controller"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/webhook"
	"github.com/tessera-dev/tessera/test/testutil"
)

// TestController runs the controller against a real kube-apiserver: the
// webhooks, gates, reasons, gangs, queue status, a restart and leader
// election.
func TestController(t *testing.T) {
	e := startEnv(t)
	// A node with 8 x H100, published as the kubelet plugin publishes.
	slices := e.gpuNode("node-1", "dgxh100")
	e.create(decidetest.Queue("org", "", "", ""), decidetest.Queue("team-a", "org", "16Gi", "16Gi"), decidetest.Queue("team-b", "org", "", ""))

	e.startController()

	t.Run("queue validation", func(t *testing.T) {
		for _, tc := range []struct {
			q    *v1alpha1.Queue
			want string
		}{
			{decidetest.Queue("x", "nope", "", ""), `queue "nope" does not exist`},
			{decidetest.Queue("x", "", "32Gi", "16Gi"), "quota must not be above limit"},
			{decidetest.Queue("x", "x", "", ""), "cannot be its own parent"},
		} {
			err := e.c.Create(e.ctx, tc.q)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("creating %+v: %v, want %q", tc.q.Spec, err, tc.want)
			}
		}
		// A cycle through an update.
		var org v1alpha1.Queue
		if err := e.c.Get(e.ctx, client.ObjectKey{Name: "org"}, &org); err != nil {
			t.Fatal(err)
		}
		org.Spec.Parent = "team-a"
		if err := e.c.Update(e.ctx, &org); err == nil || !strings.Contains(err.Error(), "would make a cycle (org -> team-a -> org)") {
			t.Errorf("cycle: %v", err)
		}
		if err := e.c.Delete(e.ctx, &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "org"}}); err == nil || !strings.Contains(err.Error(), "queue org is the parent of team-a, team-b") {
			t.Errorf("deleting a parent: %v", err)
		}
	})

	t.Run("webhook gates only labelled pods", func(t *testing.T) {
		e.create(decidetest.Pod("default", "plain", decidetest.PodOptions{}))
		if p := e.pod("plain"); gated(p) {
			t.Error("unlabelled pod was gated")
		}
	})

	t.Run("admission, limit reason, accounting from the allocation", func(t *testing.T) {
		e.create(claim("a12", decidetest.Request{Memory: "12Gi"}), claim("a8", decidetest.Request{Memory: "8Gi"}))
		e.create(asNew(claimPod("a1", "team-a", "a12")))
		if !gated(e.pod("a1")) && condition(e.pod("a1")) == nil {
			t.Error("labelled pod was not gated at creation")
		}
		e.waitAdmitted("a1")
		// Admitted in its first cycle: no condition written, one event on
		// the queue for the cycle.
		if c := condition(e.pod("a1")); c != nil {
			t.Errorf("a pod admitted without waiting got a condition written: %+v", c)
		}
		e.waitQueueEvent("team-a", "Admitted", "admitted 1 pods of 1 workloads: default/a1")
		testutil.Eventually(t, 30*time.Second, "team-a status", func() error {
			st := e.queueStatus("team-a")
			if qty(st.Allocated, v1alpha1.ResourceGPUMemory) != "12Gi" || st.AdmittedWorkloads != 1 {
				return fmt.Errorf("status %+v", st)
			}
			return nil
		})
		e.allocate("node-1", slices, "a12")
		// The kubelet plugin reports what the claim's processes use: the
		// queue and its parent show it next to the allocation.
		e.reportUsage("a12", 3<<30)
		testutil.Eventually(t, 30*time.Second, "team-a and org show 3Gi in use", func() error {
			for _, q := range []string{"team-a", "org"} {
				if st := e.queueStatus(q); qty(st.Used, v1alpha1.ResourceGPUMemory) != "3Gi" {
					return fmt.Errorf("queue %s: used %v, allocated %v", q, st.Used, st.Allocated)
				}
			}
			return nil
		})
		if table := e.table("team-a"); !strings.Contains(fmt.Sprint(table.Rows[0].Cells), "3Gi") {
			t.Errorf("kubectl get queues shows no memory in use: %v", table.Rows[0].Cells)
		}
		e.create(asNew(claimPod("a2", "team-a", "a8")))
		e.waitWaiting("a2", "QueueLimit", "queue team-a: needs 8Gi gpu memory; quota 16Gi, in use 12Gi, limit 16Gi")
		testutil.Eventually(t, 30*time.Second, "team-a pending", func() error {
			st := e.queueStatus("team-a")
			if qty(st.Pending, v1alpha1.ResourceGPUMemory) != "8Gi" || st.PendingWorkloads != 1 {
				return fmt.Errorf("status %+v", st)
			}
			return nil
		})
	})

	t.Run("bad input", func(t *testing.T) {
		e.create(asNew(decidetest.Pod("default", "lost", decidetest.PodOptions{Queue: "nope"})))
		e.waitWaiting("lost", "InvalidWorkload", "queue nope does not exist")
		e.create(asNew(decidetest.Pod("default", "toplevel", decidetest.PodOptions{Queue: "org"})))
		e.waitWaiting("toplevel", "InvalidWorkload", "queue org is not a leaf queue")
		e.create(asNew(decidetest.Pod("default", "nosize", decidetest.PodOptions{Queue: "team-b", Gang: "g"})))
		e.waitWaiting("nosize", "InvalidWorkload", "label tessera.dev/gang-size is missing")
	})

	t.Run("gang waits until all members fit, then starts together", func(t *testing.T) {
		// One GPU carries a1's share, five are taken whole: a gang of
		// 4 x 1 GPU waits.
		e.create(claim("hold", decidetest.Request{Count: 5}))
		e.create(asNew(claimPod("holder", "team-b", "hold")))
		e.waitAdmitted("holder")
		e.allocate("node-1", slices, "hold")
		for i := range 4 {
			name := fmt.Sprintf("train-%d", i)
			e.create(claim(name+"-gpu", decidetest.Request{}))
			e.create(asNew(decidetest.Pod("default", name, decidetest.PodOptions{Queue: "team-b", Gang: "train-1", GangSize: "4", Claims: []string{name + "-gpu"}})))
		}
		e.waitWaiting("train-3", "DoesNotFit", "gang train-1: 2 of 4 members' claims fit")
		// The holder ends: its claim is deallocated.
		var hold resourceapi.ResourceClaim
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: "default", Name: "hold"}, &hold); err != nil {
			t.Fatal(err)
		}
		hold.Status.Allocation = nil
		if err := e.c.Status().Update(e.ctx, &hold); err != nil {
			t.Fatal(err)
		}
		if err := e.c.Delete(e.ctx, e.pod("holder")); err != nil {
			t.Fatal(err)
		}
		e.waitAdmitted("train-0", "train-1", "train-2", "train-3")
		// The gang waited: its condition said DoesNotFit, and now says
		// Admitted; the queue has one event for the four pods.
		if c := condition(e.pod("train-3")); c == nil || c.Reason != decide.ReasonAdmitted {
			t.Errorf("train-3 waited, then was admitted: condition %+v", c)
		}
		e.waitQueueEvent("team-b", "Admitted", "admitted 4 pods of 1 workloads: default/train-1")
		for i := range 4 {
			p := e.pod(fmt.Sprintf("train-%d", i))
			if pinnedTo(p) != "node-1" || p.Annotations[v1alpha1.NodeAnnotation] != "node-1" {
				t.Errorf("%s not pinned to node-1: %v %v", p.Name, p.Spec.Affinity, p.Annotations)
			}
		}
	})

	t.Run("printer columns", func(t *testing.T) {
		table := e.table("team-a")
		want := []string{"Name", "Parent", "Mem-Quota", "Mem-Limit", "Mem-Alloc", "Mem-InUse", "Mem-Fair", "GPUs-Alloc", "Admitted", "Pending", "Age"}
		var got []string
		for _, c := range table.ColumnDefinitions {
			if c.Priority == 0 {
				got = append(got, c.Name)
			}
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("columns %v, want %v", got, want)
		}
		row := fmt.Sprint(table.Rows[0].Cells)
		for _, v := range []string{"team-a", "org", "16Gi", "12Gi"} {
			if !strings.Contains(row, v) {
				t.Errorf("row %s lacks %s", row, v)
			}
		}
	})

	t.Run("restart rebuilds from the API", func(t *testing.T) {
		before := e.queueStatus("team-b")
		e.stopController()
		// While the controller is down a pod arrives (the webhook is down
		// too: creating a labelled pod fails closed).
		err := e.c.Create(e.ctx, asNew(claimPod("during-outage", "team-a", "a8")))
		if err == nil {
			t.Error("labelled pod created while the webhook is down: the gate would be missing")
		}
		e.startController()
		testutil.Eventually(t, 30*time.Second, "status after restart", func() error {
			st := e.queueStatus("team-b")
			if st.AdmittedWorkloads != before.AdmittedWorkloads || qty(st.Allocated, v1alpha1.ResourceGPUs) != qty(before.Allocated, v1alpha1.ResourceGPUs) {
				return fmt.Errorf("team-b %+v, before restart %+v", st, before)
			}
			return nil
		})
		e.waitWaiting("a2", "QueueLimit", "in use 12Gi")
		if !gated(e.pod("a2")) {
			t.Error("a2 admitted after restart")
		}
	})

	t.Run("reclaim evicts an over-quota gang for a queue within quota", func(t *testing.T) {
		// team-b (no quota) runs the 4-GPU gang; 3 GPUs are free. team-c is
		// guaranteed 4 GPUs' memory and asks for 4 GPUs.
		e.create(decidetest.Queue("team-c", "", "400Gi", ""))
		e.create(claim("c4", decidetest.Request{Count: 4}))
		e.create(asNew(claimPod("c1", "team-c", "c4")))
		testutil.Eventually(t, 30*time.Second, "gang evicted", func() error {
			var pods corev1.PodList
			if err := e.c.List(e.ctx, &pods, client.InNamespace("default"), client.MatchingLabels{v1alpha1.GangLabel: "train-1"}); err != nil {
				return err
			}
			if len(pods.Items) != 0 {
				return fmt.Errorf("%d gang members left", len(pods.Items))
			}
			return nil
		})
		e.waitAdmitted("c1")
		var evs eventsv1.EventList
		if err := e.c.List(e.ctx, &evs, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, ev := range evs.Items {
			if ev.Regarding.Name == "train-0" && ev.Reason == "Reclaimed" && strings.Contains(ev.Note, "reclaimed for pod c1 in queue team-c") {
				found = true
			}
		}
		if !found {
			t.Error("no Reclaimed event on train-0")
		}
	})

	t.Run("leader election: a second replica takes over", func(t *testing.T) {
		holder := func() string {
			var lease struct {
				Spec struct {
					HolderIdentity *string `json:"holderIdentity"`
				} `json:"spec"`
			}
			raw, err := e.rawGet("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/tessera-controller-test")
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(raw, &lease); err != nil {
				t.Fatal(err)
			}
			return ptr.Deref(lease.Spec.HolderIdentity, "")
		}
		first := holder()
		if first == "" {
			t.Fatal("no lease holder")
		}
		second := e.startReplica(testutil.FreePort(t))
		time.Sleep(2 * time.Second)
		if h := holder(); h != first {
			t.Fatalf("lease moved to %s while %s runs", h, first)
		}
		e.stopController() // releases the lease on the way out
		testutil.Eventually(t, 30*time.Second, "second replica leads", func() error {
			if h := holder(); h == first || h == "" {
				return fmt.Errorf("holder %q", h)
			}
			return nil
		})
		// The new leader admits (its own webhook now gates pods).
		e.create(claim("late", decidetest.Request{Memory: "1Gi"}))
		testutil.Eventually(t, 30*time.Second, "webhook of the second replica", func() error {
			err := e.c.Create(e.ctx, asNew(claimPod("late", "team-b", "late")))
			if apierrors.IsAlreadyExists(err) {
				return nil
			}
			return err
		})
		e.waitAdmitted("late")
		e.cur = second
	})

	e.stopController()
}

// TestControllerChartMode runs the controller the way the Helm chart does:
// the chart makes the webhook configurations (no caBundle) and an empty
// Secret; the controller fills the Secret with its CA and sets the
// configurations' caBundle, and nothing else.
func TestControllerChartMode(t *testing.T) {
	e := startEnv(t)
	port := testutil.FreePort(t)
	base := fmt.Sprintf("https://127.0.0.1:%d", port)
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	e.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "tessera-webhook-tls"}})
	e.create(&admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "tessera-pod-admission"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "pods.admission.tessera.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To(base + webhook.PodsPath)},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			ObjectSelector:          &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: v1alpha1.QueueLabel, Operator: metav1.LabelSelectorOpExists}}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
		}},
	})
	e.create(&admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "tessera-queue-validation"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "queues.validation.tessera.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To(base + webhook.QueuesPath)},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete}, Rule: admissionregistrationv1.Rule{APIGroups: []string{"tessera.dev"}, APIVersions: []string{"v1alpha1"}, Resources: []string{"queues"}}}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
		}},
	})
	e.opts.WebhookPort = port
	e.opts.WebhookConfig = controller.WebhookAuto
	e.opts.WebhookCertSecret = "tessera-webhook-tls"
	e.opts.WebhookCertHosts = []string{"127.0.0.1"}
	e.opts.MutatingConfiguration = "tessera-pod-admission"
	e.opts.ValidatingConfiguration = "tessera-queue-validation"
	e.opts.Complete(func(f string) bool { return f == "webhook-host" })
	if e.opts.WebhookConfig != controller.WebhookPatch {
		t.Fatalf("auto mode with configuration names resolved to %s", e.opts.WebhookConfig)
	}
	e.startController()
	defer e.stopController()
	var s corev1.Secret
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: "kube-system", Name: "tessera-webhook-tls"}, &s); err != nil || len(s.Data["ca.crt"]) == 0 {
		t.Fatalf("secret not filled: %v", err)
	}
	var m admissionregistrationv1.MutatingWebhookConfiguration
	if err := e.c.Get(e.ctx, client.ObjectKey{Name: "tessera-pod-admission"}, &m); err != nil {
		t.Fatal(err)
	}
	if string(m.Webhooks[0].ClientConfig.CABundle) != string(s.Data["ca.crt"]) || *m.Webhooks[0].ClientConfig.URL != base+webhook.PodsPath {
		t.Errorf("mutating configuration: caBundle not the Secret's CA, or more than the caBundle changed: %+v", m.Webhooks[0].ClientConfig)
	}
	e.create(decidetest.Queue("q", "", "", ""))
	e.create(asNew(decidetest.Pod("default", "p", decidetest.PodOptions{Queue: "q"})))
	e.waitAdmitted("p")
}
