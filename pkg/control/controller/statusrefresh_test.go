package controller

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
)

// histogramCount is how many observations the histogram name holds.
func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, f := range fams {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// refreshEnv is a Reconciler on a fake API with nothing gated, and the
// scheduler, kubelet and kubelet plugin played by hand: start runs a pod
// of queue "team" with its claim allocated, end ends it, sample reports a
// claim's usage. Every change goes through the Reconciler's Handler.
type refreshEnv struct {
	start  func(name, mem string)
	end    func(name string)
	sample func(name string, used uint64)
	a      *Reconciler
	c      client.Client
	reg    *prometheus.Registry
	q      workqueue.TypedRateLimitingInterface[reconcile.Request]
	h      handler.EventHandler
}

func newRefreshEnv(t *testing.T, reader func(client.Client) client.Reader) *refreshEnv {
	t.Helper()
	scheme, err := NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	slices, err := decidetest.NodeSlices("node-1", decidetest.NodeOptions{Profile: "h100-80gb:2"})
	if err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{decidetest.Queue("team", "", "", ""), decidetest.Node("node-1")}
	for _, s := range slices {
		objs = append(objs, s)
	}
	for _, c := range decidetest.Classes() {
		objs = append(objs, c)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&corev1.Pod{}, &v1alpha1.Queue{}, &resourceapi.ResourceClaim{}).Build()
	reg := prometheus.NewRegistry()
	a := &Reconciler{Client: c, Reader: reader(c), Recorder: events.NewFakeRecorder(100),
		Engine:  decide.NewEngine(decide.Config{Features: allocation.SchedulerFeatures}),
		Metrics: NewMetrics(reg), Opts: Options{ResyncPeriod: time.Hour, ApplyWorkers: 4, PinNodes: PinAll, StalePinGrace: time.Minute}}
	ctx := context.Background()
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	t.Cleanup(q.ShutDown)
	h := a.Handler()
	state := allocation.NewState()

	// Scheduler and kubelet, played: a running (ungated) pod of the queue
	// with its claim allocated; a pod that ends and its claim released.
	start := func(name, mem string) {
		t.Helper()
		cl := decidetest.Claim("default", name, decidetest.Request{Memory: mem})
		cl.UID = ""
		if err := c.Create(ctx, cl); err != nil {
			t.Fatal(err)
		}
		h.Create(ctx, event.CreateEvent{Object: cl}, q)
		p := decidetest.Pod("default", name, decidetest.PodOptions{Queue: "team", Claims: []string{name}})
		p.UID, p.Spec.NodeName = "", "node-1"
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		h.Create(ctx, event.CreateEvent{Object: p}, q)
		res, err := allocation.NewAllocator(slices, decidetest.Classes()).Allocate(ctx, decidetest.Node("node-1"), state, cl)
		if err != nil || res == nil {
			t.Fatalf("allocating claim %s: %v %v", name, res, err)
		}
		state.Add(&res[0])
		old := cl.DeepCopy()
		cl.Status.Allocation = &res[0]
		cl.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name, UID: p.UID}}
		if err := c.Status().Update(ctx, cl); err != nil {
			t.Fatal(err)
		}
		h.Update(ctx, event.UpdateEvent{ObjectOld: old, ObjectNew: cl}, q)
	}
	end := func(name string) {
		t.Helper()
		var p corev1.Pod
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &p); err != nil {
			t.Fatal(err)
		}
		old := p.DeepCopy()
		p.Status.Phase = corev1.PodSucceeded
		if err := c.Status().Update(ctx, &p); err != nil {
			t.Fatal(err)
		}
		h.Update(ctx, event.UpdateEvent{ObjectOld: old, ObjectNew: &p}, q)
		var cl resourceapi.ResourceClaim
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &cl); err != nil {
			t.Fatal(err)
		}
		oldCl := cl.DeepCopy()
		cl.Status.Allocation, cl.Status.ReservedFor = nil, nil
		if err := c.Status().Update(ctx, &cl); err != nil {
			t.Fatal(err)
		}
		h.Update(ctx, event.UpdateEvent{ObjectOld: oldCl, ObjectNew: &cl}, q)
	}

	// The kubelet plugin, played: a usage sample in the claim's status.
	sample := func(name string, used uint64) {
		t.Helper()
		var cl resourceapi.ResourceClaim
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &cl); err != nil {
			t.Fatal(err)
		}
		old := cl.DeepCopy()
		raw, err := json.Marshal(v1alpha1.DeviceStatus{UUID: "GPU-x", Usage: &v1alpha1.DeviceUsage{MemoryUsedBytes: used, Processes: 1, SampledAt: metav1.Now()}})
		if err != nil {
			t.Fatal(err)
		}
		r := cl.Status.Allocation.Devices.Results[0]
		st := resourceapi.AllocatedDeviceStatus{Driver: r.Driver, Pool: r.Pool, Device: r.Device, Data: &runtime.RawExtension{Raw: raw}}
		if r.ShareID != nil {
			st.ShareID = ptr.To(string(*r.ShareID))
		}
		cl.Status.Devices = []resourceapi.AllocatedDeviceStatus{st}
		if err := c.Status().Update(ctx, &cl); err != nil {
			t.Fatal(err)
		}
		h.Update(ctx, event.UpdateEvent{ObjectOld: old, ObjectNew: &cl}, q)
	}

	return &refreshEnv{start: start, end: end, sample: sample, a: a, c: c, reg: reg, q: q, h: h}
}

// TestStatusRefreshWithoutCycles checks that with no pod gated, pods and
// claims that change run no decision cycle (no cycle counted, no cycle
// timed) while queue status still follows the allocations, through status
// refreshes counted apart; and that a gated pod still gets its cycle.
func TestStatusRefreshWithoutCycles(t *testing.T) {
	e := newRefreshEnv(t, func(c client.Client) client.Reader { return c })
	start, end, sample, a, c, reg, q, h := e.start, e.end, e.sample, e.a, e.c, e.reg, e.q, e.h
	ctx := context.Background()
	for i, step := range []struct {
		name     string
		do       func()
		memory   string // team's status.allocated gpu memory after it
		admitted int32
		used     string // team's status.used gpu memory ("": none)
	}{
		{"two pods start", func() { start("a", "12Gi"); start("b", "8Gi") }, "20Gi", 2, ""},
		{"one ends", func() { end("a") }, "8Gi", 1, ""},
		{"another starts", func() { start("c", "16Gi") }, "24Gi", 2, ""},
		{"a usage sample", func() { sample("c", 3<<30) }, "24Gi", 2, "3Gi"},
		{"both end", func() { end("b"); end("c") }, "0", 0, ""},
	} {
		step.do()
		if q.Len() == 0 {
			t.Fatalf("%s: the changes woke nothing", step.name)
		}
		if _, err := a.Reconcile(ctx, CycleRequest); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := counter(t, reg, MetricCyclesTotal); len(got) != 0 {
			t.Errorf("%s: decision cycles ran with nothing gated: %v", step.name, got)
		}
		if n := histogramCount(t, reg, MetricCycleSeconds); n != 0 {
			t.Errorf("%s: %d cycle phases timed with nothing gated", step.name, n)
		}
		if n := histogramCount(t, reg, MetricStatusRefreshSeconds); n != uint64(i+1) {
			t.Errorf("%s: %d status refreshes, want %d", step.name, n, i+1)
		}
		var got v1alpha1.Queue
		if err := c.Get(ctx, client.ObjectKey{Name: "team"}, &got); err != nil {
			t.Fatal(err)
		}
		mem := got.Status.Allocated[v1alpha1.ResourceGPUMemory]
		if mem.String() != step.memory || got.Status.AdmittedWorkloads != step.admitted {
			t.Errorf("%s: queue status allocated %s, %d admitted; want %s, %d", step.name, mem.String(), got.Status.AdmittedWorkloads, step.memory, step.admitted)
		}
		used := ""
		if u, ok := got.Status.Used[v1alpha1.ResourceGPUMemory]; ok {
			used = u.String()
		}
		if used != step.used {
			t.Errorf("%s: queue status used %q, want %q", step.name, used, step.used)
		}
	}
	// Nothing changed since: a wake-up refreshes nothing.
	if _, err := a.Reconcile(ctx, CycleRequest); err != nil {
		t.Fatal(err)
	}
	if n := histogramCount(t, reg, MetricStatusRefreshSeconds); n != 5 {
		t.Errorf("a wake-up without changes refreshed status: %d refreshes, want 5", n)
	}
	// A gated pod still gets its decision cycle, and is admitted.
	g := decidetest.Pod("default", "gated", decidetest.PodOptions{Queue: "team", Gated: true, Templates: nil})
	g.UID = ""
	if err := c.Create(ctx, g); err != nil {
		t.Fatal(err)
	}
	h.Create(ctx, event.CreateEvent{Object: g}, q)
	if _, err := a.Reconcile(ctx, CycleRequest); err != nil {
		t.Fatal(err)
	}
	if got := counter(t, reg, MetricCyclesTotal); got[TriggerPod] != 1 || len(got) != 1 {
		t.Errorf("cycles %v after a gated pod, want pod: 1", got)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "gated"}, g); err != nil {
		t.Fatal(err)
	}
	if decide.HasAdmissionGate(g) {
		t.Error("the gated pod was not admitted by its cycle")
	}
}

// listHook calls after once, right after the first claim list that
// follows arming it: a change that lands while a refresh is running.
type listHook struct {
	client.Reader
	armed bool
	after func()
}

func (r *listHook) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	err := r.Reader.List(ctx, list, opts...)
	if _, ok := list.(*resourceapi.ResourceClaimList); ok && r.armed {
		r.armed = false
		r.after()
	}
	return err
}

// TestStatusRefreshKeepsChangeDuringIt checks that a usage sample that
// arrives after a refresh read its snapshot is refreshed next time rather
// than lost (the change is marked while the refresh runs; clearing the mark
// when the refresh ends lost it, and queue status stayed stale until the
// next unrelated change).
func TestStatusRefreshKeepsChangeDuringIt(t *testing.T) {
	hook := &listHook{}
	e := newRefreshEnv(t, func(c client.Client) client.Reader { hook.Reader = c; return hook })
	ctx := context.Background()
	e.start("a", "12Gi")
	hook.armed, hook.after = true, func() { e.sample("a", 3<<30) }
	if _, err := e.a.Reconcile(ctx, CycleRequest); err != nil {
		t.Fatal(err)
	}
	if hook.armed {
		t.Fatal("the refresh listed no claims")
	}
	used := func() string {
		var q v1alpha1.Queue
		if err := e.c.Get(ctx, client.ObjectKey{Name: "team"}, &q); err != nil {
			t.Fatal(err)
		}
		u := q.Status.Used[v1alpha1.ResourceGPUMemory]
		return u.String()
	}
	if got := used(); got != "0" {
		t.Fatalf("the first refresh saw the sample its snapshot missed: used %s", got)
	}
	res, err := e.a.Reconcile(ctx, CycleRequest)
	if err != nil {
		t.Fatal(err)
	}
	if got := used(); got != "3Gi" {
		t.Errorf("after the next wake-up queue status shows used %s, want 3Gi (result %+v)", got, res)
	}
}

// conflictOnce fails the first status update of a Queue with a conflict,
// as the history keeper's own status write can make it.
type conflictOnce struct {
	client.Client
	failed bool
}

func (c *conflictOnce) Status() client.SubResourceWriter {
	return &conflictWriter{c.Client.Status(), c}
}

type conflictWriter struct {
	client.SubResourceWriter
	c *conflictOnce
}

func (w *conflictWriter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if q, ok := obj.(*v1alpha1.Queue); ok && !w.c.failed {
		w.c.failed = true
		return apierrors.NewConflict(v1alpha1.GroupVersion.WithResource("queues").GroupResource(), q.Name, errors.New("the object has been modified"))
	}
	return w.SubResourceWriter.Update(ctx, obj, opts...)
}

// TestStatusRefreshRetriesConflict checks that a queue status write that
// conflicts is written again: with nothing gated no cycle comes by later.
func TestStatusRefreshRetriesConflict(t *testing.T) {
	e := newRefreshEnv(t, func(c client.Client) client.Reader { return c })
	w := &conflictOnce{Client: e.c}
	e.a.Client = w
	ctx := context.Background()
	e.start("a", "12Gi")
	res, err := e.a.Reconcile(ctx, CycleRequest)
	if err != nil {
		t.Fatal(err)
	}
	if !w.failed {
		t.Fatal("no queue status was written")
	}
	if res.RequeueAfter <= 0 {
		t.Errorf("after a conflicting write the controller asks no wake-up: %+v", res)
	}
	if _, err := e.a.Reconcile(ctx, CycleRequest); err != nil {
		t.Fatal(err)
	}
	var q v1alpha1.Queue
	if err := e.c.Get(ctx, client.ObjectKey{Name: "team"}, &q); err != nil {
		t.Fatal(err)
	}
	if mem := q.Status.Allocated[v1alpha1.ResourceGPUMemory]; mem.String() != "12Gi" {
		t.Errorf("queue status allocated %s after the retry, want 12Gi", mem.String())
	}
}
