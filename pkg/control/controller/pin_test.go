package controller

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
)

func TestPinTerms(t *testing.T) {
	pin := pinRequirement("node-1")
	expr := corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}
	withTerms := func(terms ...corev1.NodeSelectorTerm) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}}}}
	}
	// No affinity: one term naming the node.
	terms, ok := pinTerms(&corev1.Pod{}, "node-1")
	if !ok || len(terms) != 1 || len(terms[0].MatchFields) != 1 || terms[0].MatchFields[0].Key != "metadata.name" || terms[0].MatchFields[0].Values[0] != "node-1" {
		t.Fatalf("no affinity: %+v %v", terms, ok)
	}
	// Two ORed terms: each gains the requirement at its end, nothing else
	// changes (the only mutation the API allows on a gated pod).
	p := withTerms(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{expr}},
		corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"x"}}}})
	terms, ok = pinTerms(p, "node-1")
	if !ok || len(terms) != 2 {
		t.Fatalf("two terms: %+v %v", terms, ok)
	}
	if len(terms[0].MatchExpressions) != 1 || len(terms[0].MatchFields) != 1 || terms[0].MatchFields[0].Values[0] != "node-1" {
		t.Errorf("term 0: %+v", terms[0])
	}
	if len(terms[1].MatchFields) != 2 || terms[1].MatchFields[0].Operator != corev1.NodeSelectorOpNotIn || terms[1].MatchFields[1].Values[0] != "node-1" {
		t.Errorf("term 1: %+v", terms[1])
	}
	if len(p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchFields) != 0 {
		t.Error("pinTerms changed the pod")
	}
	// Already pinned: nothing to do. An empty term: the API refuses
	// additions to it (and it matches no node).
	if _, ok := pinTerms(withTerms(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{pin}}), "node-1"); ok {
		t.Error("pinned again")
	}
	if _, ok := pinTerms(withTerms(corev1.NodeSelectorTerm{}), "node-1"); ok {
		t.Error("pinned an empty term")
	}
}

func pinnedPod(name, node string, cond *corev1.PodCondition) *corev1.Pod {
	p := decidetest.Pod("default", name, decidetest.PodOptions{Queue: "team"})
	p.Annotations = map[string]string{PinnedAnnotation: node}
	if cond != nil {
		p.Status.Conditions = []corev1.PodCondition{*cond}
	}
	return p
}

func TestStalePins(t *testing.T) {
	now := time.Now()
	unsched := func(since time.Duration) *corev1.PodCondition {
		return &corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
			Message: "0/1 nodes are available", LastTransitionTime: metav1.NewTime(now.Add(-since))}
	}
	bound := pinnedPod("bound", "node-1", unsched(time.Hour))
	bound.Spec.NodeName = "node-1"
	gated := pinnedPod("gated", "gone", nil)
	gated.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: v1alpha1.AdmissionGate}}
	pods := []*corev1.Pod{
		pinnedPod("gone", "node-2", nil),
		pinnedPod("long", "node-1", unsched(3*time.Minute)),
		pinnedPod("short", "node-1", unsched(30*time.Second)),
		pinnedPod("fine", "node-1", nil),
		bound, gated,
		decidetest.Pod("default", "unpinned", decidetest.PodOptions{Queue: "team"}),
	}
	stale, next := stalePins(pods, map[string]bool{"node-1": true}, 2*time.Minute, now)
	got := map[string]string{}
	for _, s := range stale {
		got[s.pod.Name] = s.reason
	}
	if len(got) != 2 || got["gone"] != StaleNodeGone || got["long"] != StaleUnschedulable {
		t.Errorf("stale pins %v, want gone: node-gone, long: unschedulable", got)
	}
	if want := now.Add(90 * time.Second); !next.Equal(want) {
		t.Errorf("next deadline %v, want %v (short's grace)", next, want)
	}
	owned := pinnedPod("owned", "node-2", nil)
	owned.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-1", UID: "rs", Controller: new(true)}}
	if m := staleMessage(stalePin{owned, StaleNodeGone, "x"}); !contains(m, "ReplicaSet/web-1 recreates it") {
		t.Errorf("owned: %s", m)
	}
	if m := staleMessage(stalePin{pods[0], StaleNodeGone, "x"}); !contains(m, "no owner") {
		t.Errorf("bare: %s", m)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func counter(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			out[m.GetLabel()[0].GetValue()] += m.GetCounter().GetValue()
		}
	}
	return out
}

// TestNoIdleWork: with no gated pod, a stream of changes that cannot admit
// one (node heartbeats, claim device status, a running pod's status, the
// controller's own queue status) enqueues nothing and runs no cycle; a
// wake-up with nothing gated runs none either; a gated pod runs one.
func TestNoIdleWork(t *testing.T) {
	scheme, err := NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	queue := decidetest.Queue("team", "", "", "")
	node := decidetest.Node("node-1")
	running := decidetest.Pod("default", "running", decidetest.PodOptions{Queue: "team"})
	running.Spec.NodeName = "node-1"
	running.Status.Phase = corev1.PodRunning
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "c", UID: "claim"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}, ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "running", UID: running.UID}}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(queue, node, running, claim).
		WithStatusSubresource(&corev1.Pod{}, &v1alpha1.Queue{}).Build()
	reg := prometheus.NewRegistry()
	a := &Reconciler{Client: c, Reader: c, Recorder: events.NewFakeRecorder(100),
		Engine:  decide.NewEngine(decide.Config{Features: allocation.SchedulerFeatures}),
		Metrics: NewMetrics(reg), Opts: Options{CycleInterval: 0, ResyncPeriod: time.Hour, ApplyWorkers: 4, PinNodes: PinAll, StalePinGrace: time.Minute, ReplaceStalePins: true}}
	// The last cycle was just now (no start-up accounting cycle here).
	a.last = time.Now()
	ctx := context.Background()
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	h := a.Handler()
	update := func(old, new client.Object) { h.Update(ctx, event.UpdateEvent{ObjectOld: old, ObjectNew: new}, q) }
	for i := range 100 {
		n := node.DeepCopy()
		n.ResourceVersion = string(rune('a' + i%26))
		n.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(time.Now().Add(time.Duration(i) * time.Second))
		update(node, n)
		cl := claim.DeepCopy()
		cl.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: "gpu.tessera.dev", Pool: "node-1", Device: "gpu-0"}}
		update(claim, cl)
		p := running.DeepCopy()
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		update(running, p)
		qs := queue.DeepCopy()
		qs.Status.AdmittedWorkloads = int32(i)
		update(queue, qs)
	}
	if n := q.Len(); n != 0 {
		t.Fatalf("%d cycles enqueued by irrelevant changes", n)
	}
	if _, err := a.Reconcile(ctx, CycleRequest); err != nil {
		t.Fatal(err)
	}
	if got := counter(t, reg, MetricCyclesTotal); len(got) != 0 {
		t.Errorf("cycles ran with nothing gated: %v", got)
	}
	if got := counter(t, reg, MetricCyclesSkippedTotal); got[SkipNothingGated] != 1 {
		t.Errorf("skipped cycles %v, want nothing-gated: 1", got)
	}
	// A gated pod created: one cycle, for it.
	gated := decidetest.Pod("default", "gated", decidetest.PodOptions{Queue: "team", Gated: true})
	gated.UID = ""
	if err := c.Create(ctx, gated); err != nil {
		t.Fatal(err)
	}
	h.Create(ctx, event.CreateEvent{Object: gated}, q)
	if q.Len() != 1 {
		t.Fatalf("a gated pod enqueued %d cycles, want 1", q.Len())
	}
	a.last = time.Time{}
	if _, err := a.Reconcile(ctx, CycleRequest); err != nil {
		t.Fatal(err)
	}
	if got := counter(t, reg, MetricCyclesTotal); got[TriggerPod] != 1 || len(got) != 1 {
		t.Errorf("cycles %v, want pod: 1", got)
	}
	// The controller's own condition on the gated pod is no trigger.
	g2 := gated.DeepCopy()
	g2.Status.Conditions = []corev1.PodCondition{{Type: v1alpha1.AdmissionCondition, Status: corev1.ConditionFalse, Reason: "Waiting"}}
	q2 := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q2.ShutDown()
	h.Update(ctx, event.UpdateEvent{ObjectOld: gated, ObjectNew: g2}, q2)
	if q2.Len() != 0 {
		t.Error("a status-only change of a gated pod enqueued a cycle")
	}
}

func TestChangeTrigger(t *testing.T) {
	node := decidetest.Node("n")
	cordoned := node.DeepCopy()
	cordoned.Spec.Unschedulable = true
	notReady := node.DeepCopy()
	notReady.Status.Conditions[0].Status = corev1.ConditionFalse
	pod := decidetest.Pod("default", "p", decidetest.PodOptions{Queue: "team"})
	pod.Spec.NodeName = "n"
	done := pod.DeepCopy()
	done.Status.Phase = corev1.PodSucceeded
	pinned := pinnedPod("pinned", "n", nil)
	unsched := pinned.DeepCopy()
	unsched.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x"}}
	nsQueued := ns.DeepCopy()
	nsQueued.Labels = map[string]string{v1alpha1.QueueLabel: "team"}
	nsTeam := ns.DeepCopy()
	nsTeam.Labels = map[string]string{"team": "a"}
	gpuPlugin := node.DeepCopy()
	gpuPlugin.Status.Allocatable = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}
	slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s", Generation: 1}}
	slice2 := slice.DeepCopy()
	slice2.Generation = 2
	// Moving a queue tree to another controller is a spec change: the
	// API server bumps the generation; a status write does not.
	q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "q", Generation: 1}}
	moved := q.DeepCopy()
	moved.Spec.ControllerName, moved.Generation = "canary", 2
	statusOnly := q.DeepCopy()
	statusOnly.Status.PendingWorkloads = 3
	for _, c := range []struct {
		name     string
		old, new client.Object
		trigger  string
		want     bool
	}{
		{"node cordoned", node, cordoned, TriggerNode, true},
		{"node not ready", node, notReady, TriggerNode, true},
		{"node deleted", node, nil, TriggerNode, true},
		{"pod ended", pod, done, TriggerPod, true},
		{"pinned pod unschedulable", pinned, unsched, TriggerStalePin, true},
		{"namespace labelled", ns, nsQueued, TriggerNamespace, true},
		{"unqueued namespace created", nil, ns, TriggerNamespace, false},
		{"namespace relabelled (a queue's namespaceSelector may match)", ns, nsTeam, TriggerNamespace, true},
		{"namespace unchanged", nsTeam, nsTeam.DeepCopy(), TriggerNamespace, false},
		{"a device plugin serves an extended resource on the node", node, gpuPlugin, TriggerNode, true},
		{"slice republished", slice, slice2, TriggerSlice, true},
		{"slice unchanged", slice, slice.DeepCopy(), TriggerSlice, false},
		{"queue moved to another controller", q, moved, TriggerQueue, true},
		{"queue status written", q, statusOnly, TriggerQueue, false},
	} {
		trig, ok := changeTrigger(c.old, c.new)
		if ok != c.want || (ok && trig != c.trigger) {
			t.Errorf("%s: %q %v, want %q %v", c.name, trig, ok, c.trigger, c.want)
		}
	}
}
