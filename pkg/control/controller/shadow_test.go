package controller

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/whatif"
)

func withCondition(p *corev1.Pod, reason string) *corev1.Pod {
	status := corev1.ConditionFalse
	if reason == decide.ReasonAdmitted {
		status = corev1.ConditionTrue
	}
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: v1alpha1.AdmissionCondition, Status: status, Reason: reason, Message: "m-" + reason})
	return p
}

func ungated(p *corev1.Pod) *corev1.Pod {
	p.Spec.SchedulingGates = nil
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[v1alpha1.AdmittedAtAnnotation] = "2026-01-01T00:00:00Z"
	return p
}

func terminating(p *corev1.Pod) *corev1.Pod {
	t := metav1.Now()
	p.DeletionTimestamp = &t
	return p
}

// TestShadowCompare: the shadow's previous decisions against what the
// active controller did since, as the pods show it.
func TestShadowCompare(t *testing.T) {
	pod := func(name string, gatedPod bool) *corev1.Pod {
		return decidetest.Pod("ns", name, decidetest.PodOptions{Queue: "q", Gated: gatedPod})
	}
	v := func(what, reason, name string) shadowVerdict {
		return shadowVerdict{what: what, reason: reason, message: "why-" + name, workload: "ns/" + name, queue: "q", pods: 1}
	}
	pods := []*corev1.Pod{
		withCondition(pod("admit-held", true), decide.ReasonQueueLimit),                         // shadow admitted, still gated: would-admit
		ungated(pod("admit-done", false)),                                                       // shadow admitted, active did too
		ungated(pod("hold-admitted", false)),                                                    // shadow held, active admitted: would-hold
		withCondition(pod("hold-other", true), decide.ReasonDoesNotFit),                         // both hold, other reasons
		withCondition(pod("hold-same", true), decide.ReasonQueueLimit),                          // both hold, same reason
		ungated(pod("evict-kept", false)),                                                       // shadow would evict, still runs: would-reclaim
		withCondition(terminating(ungated(pod("kept-evicted", false))), decide.ReasonReclaimed), // active evicted: would-keep
		withCondition(terminating(ungated(pod("both-evicted", false))), decide.ReasonReclaimed), // both evicted
	}
	uid := func(name string) types.UID { return types.UID("uid-pod-ns-" + name) }
	prev := map[types.UID]shadowVerdict{
		uid("admit-held"):    v(whatif.Start, decide.ReasonAdmitted, "admit-held"),
		uid("admit-done"):    v(whatif.Start, decide.ReasonAdmitted, "admit-done"),
		uid("hold-admitted"): v(whatif.Wait, decide.ReasonQueueLimit, "hold-admitted"),
		uid("hold-other"):    v(whatif.Wait, decide.ReasonQueueLimit, "hold-other"),
		uid("hold-same"):     v(whatif.Wait, decide.ReasonQueueLimit, "hold-same"),
		uid("evict-kept"):    v(whatif.Reclaim, decide.ReasonReclaimed, "evict-kept"),
		uid("both-evicted"):  v(whatif.Reclaim, decide.ReasonReclaimed, "both-evicted"),
	}
	running := map[types.UID]bool{uid("kept-evicted"): true, uid("both-evicted"): true, uid("evict-kept"): true}
	reported := map[types.UID]string{}
	diffs := compare(prev, running, reported, pods, time.Now(), 7)
	got := map[string]string{}
	for _, d := range diffs {
		got[d.Workload] = d.Kind
		if d.Cycle != 7 || d.Queue != "q" {
			t.Errorf("%+v: want cycle 7, queue q", d)
		}
	}
	want := map[string]string{
		"ns/admit-held": whatif.WouldAdmit, "ns/hold-admitted": whatif.WouldHold, "ns/hold-other": whatif.OtherReason,
		"ns/evict-kept": whatif.WouldReclaim, "ns/kept-evicted": whatif.WouldKeep,
	}
	if len(got) != len(want) {
		t.Errorf("differences %v, want %v", got, want)
	}
	for w, k := range want {
		if got[w] != k {
			t.Errorf("%s: %q, want %q", w, got[w], k)
		}
	}
	for _, d := range diffs {
		if d.Workload == "ns/admit-held" && !strings.Contains(d.Active, "QueueLimit") {
			t.Errorf("would-admit says what the active controller said: %q", d.Active)
		}
	}
	// The same state again: nothing new is reported.
	if again := compare(prev, running, reported, pods, time.Now(), 8); len(again) != 0 {
		t.Errorf("differences reported twice: %+v", again)
	}
}

func TestShadowReportBoundedNewestFirst(t *testing.T) {
	var r whatif.ShadowReport
	for i := range whatif.MaxShadowEntries + 10 {
		r.Add(time.Unix(int64(i), 0), []whatif.Difference{{Cycle: int64(i), Kind: whatif.WouldAdmit, Workload: "ns/p"}})
	}
	if len(r.Entries) != whatif.MaxShadowEntries || r.Entries[0].Cycle != whatif.MaxShadowEntries+9 {
		t.Fatalf("%d entries, newest cycle %d", len(r.Entries), r.Entries[0].Cycle)
	}
	if r.Totals[whatif.WouldAdmit] != whatif.MaxShadowEntries+10 {
		t.Errorf("totals %v", r.Totals)
	}
	var out bytes.Buffer
	r.Print(&out, 5)
	if !strings.Contains(out.String(), "older differences") || !strings.Contains(out.String(), "+ shadow") {
		t.Errorf("print:\n%s", out.String())
	}
}

// writeLog records every write that reaches the API.
type writeLog struct {
	client.Client
	mu     sync.Mutex
	writes []string
}

func (w *writeLog) log(op string, obj client.Object) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = append(w.writes, op+" "+obj.GetObjectKind().GroupVersionKind().Kind+" "+obj.GetNamespace()+"/"+obj.GetName())
}

func (w *writeLog) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	w.log("create", obj)
	return w.Client.Create(ctx, obj, opts...)
}

func (w *writeLog) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	w.log("update", obj)
	return w.Client.Update(ctx, obj, opts...)
}

func (w *writeLog) Patch(ctx context.Context, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
	w.log("patch", obj)
	return w.Client.Patch(ctx, obj, p, opts...)
}

func (w *writeLog) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	w.log("delete", obj)
	return w.Client.Delete(ctx, obj, opts...)
}

// TestGuardClientRefusesAllButReport: every write but the report's is
// refused with ErrShadowWrite and counted, and reaches nothing.
func TestGuardClientRefusesAllButReport(t *testing.T) {
	ctx := context.Background()
	s, err := NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	p := decidetest.Pod("ns", "p", decidetest.PodOptions{Queue: "q", Gated: true})
	q := decidetest.Queue("q", "", "1Gi", "")
	base := &writeLog{Client: fake.NewClientBuilder().WithScheme(s).WithObjects(p, q).WithStatusSubresource(&corev1.Pod{}, &v1alpha1.Queue{}).Build()}
	refused := 0
	g := NewGuardClient(base, "tessera", "report", func() { refused++ })
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"a":"b"}}}`))
	tries := map[string]error{
		"create pod":          g.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "x"}}),
		"update pod":          g.Update(ctx, p.DeepCopy()),
		"patch pod":           g.Patch(ctx, p.DeepCopy(), patch),
		"delete pod":          g.Delete(ctx, p.DeepCopy()),
		"delete all pods":     g.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace("ns")),
		"pod status patch":    g.Status().Patch(ctx, p.DeepCopy(), patch),
		"queue status update": g.Status().Update(ctx, q.DeepCopy()),
		"eviction":            g.SubResource("eviction").Create(ctx, p.DeepCopy(), &policyv1.Eviction{}),
		"event":               g.Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "e"}}),
		"other configmap":     g.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "tessera", Name: "other"}}),
		"report elsewhere":    g.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "report"}}),
		"delete report":       g.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "tessera", Name: "report"}}),
		"report status":       g.Status().Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "tessera", Name: "report"}}),
		"apply":               g.Apply(ctx, nil),
	}
	for name, err := range tries {
		if !errors.Is(err, ErrShadowWrite) {
			t.Errorf("%s: %v, want ErrShadowWrite", name, err)
		}
	}
	if refused != len(tries) {
		t.Errorf("%d refusals counted, want %d", refused, len(tries))
	}
	if len(base.writes) != 0 {
		t.Errorf("writes reached the API: %v", base.writes)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "tessera", Name: "report"}, Data: map[string]string{"a": "b"}}
	if err := g.Create(ctx, cm); err != nil {
		t.Fatalf("creating the report: %v", err)
	}
	cm.Data["a"] = "c"
	if err := g.Update(ctx, cm); err != nil {
		t.Fatalf("updating the report: %v", err)
	}
	var got corev1.Pod
	if err := g.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
		t.Errorf("reads pass: %v", err)
	}
}

// TestShadowCycleWritesOnlyReport runs two shadow cycles over a fake API:
// the shadow's queue setting (a higher limit) admits a pod the active
// controller holds; the second cycle reports it as would-admit; the pods
// are untouched and the only writes are the report's.
func TestShadowCycleWritesOnlyReport(t *testing.T) {
	ctx := context.Background()
	s, err := NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	slices, err := decidetest.NodeSlices("n1", decidetest.NodeOptions{Profile: "h100-80gb:1"})
	if err != nil {
		t.Fatal(err)
	}
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	objs := []client.Object{
		decidetest.Queue("team-a", "", "50Gi", "50Gi"),
		decidetest.Template("ns", "gpu30", decidetest.Request{Memory: "30Gi"}),
		decidetest.Node("n1"),
		// a: admitted and running (holds 30Gi); b: held by the active
		// controller at the queue's limit.
		ungated(decidetest.Pod("ns", "a", decidetest.PodOptions{Queue: "team-a", Claims: []string{"a-gpu"}, Created: t0})),
		withCondition(decidetest.Pod("ns", "b", decidetest.PodOptions{Queue: "team-a", Templates: []string{"gpu30"}, Gated: true, Created: t0}), decide.ReasonQueueLimit),
		decidetest.Claim("ns", "a-gpu", decidetest.Request{Memory: "30Gi"}),
	}
	for _, sl := range slices {
		objs = append(objs, sl)
	}
	for _, c := range decidetest.Classes() {
		objs = append(objs, c)
	}
	base := &writeLog{Client: fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithStatusSubresource(&corev1.Pod{}, &v1alpha1.Queue{}).Build()}
	reg := prometheus.NewRegistry()
	o := Options{Namespace: "tessera", Shadow: true, ShadowReport: "shadow-report", ApplyWorkers: 4, ResyncPeriod: time.Nanosecond, Registry: reg}
	a := &Reconciler{Client: base, Reader: base,
		Engine:  decide.NewEngine(decide.Config{Reclaim: true, MaxReclaimsPerCycle: 16, Features: allocation.SchedulerFeatures}),
		Metrics: NewMetrics(reg), Opts: o}
	if err := makeShadow(a, base, o); err != nil {
		t.Fatal(err)
	}
	a.Shadow.Queues = []*v1alpha1.Queue{decidetest.Queue("team-a", "", "100Gi", "100Gi")}
	for range 2 {
		if _, err := a.Reconcile(ctx, CycleRequest); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range base.writes {
		if !strings.HasSuffix(w, " tessera/shadow-report") || !strings.HasPrefix(w, "create ") && !strings.HasPrefix(w, "update ") {
			t.Errorf("the shadow wrote %s", w)
		}
	}
	if len(base.writes) == 0 {
		t.Fatal("the shadow wrote no report")
	}
	var b corev1.Pod
	if err := base.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "b"}, &b); err != nil {
		t.Fatal(err)
	}
	if !decide.HasAdmissionGate(&b) || len(b.Status.Conditions) != 1 || b.Status.Conditions[0].Reason != decide.ReasonQueueLimit {
		t.Errorf("the shadow touched pod b: gates %v, conditions %v", b.Spec.SchedulingGates, b.Status.Conditions)
	}
	var cm corev1.ConfigMap
	if err := base.Get(ctx, types.NamespacedName{Namespace: "tessera", Name: "shadow-report"}, &cm); err != nil {
		t.Fatal(err)
	}
	r, err := whatif.ParseShadowReport(cm.Data)
	if err != nil {
		t.Fatal(err)
	}
	if r.Cycles != 2 || len(r.Entries) != 1 || r.Entries[0].Kind != whatif.WouldAdmit || r.Entries[0].Workload != "ns/b" {
		t.Fatalf("report: %d cycles, entries %+v", r.Cycles, r.Entries)
	}
	if !strings.Contains(r.Entries[0].Active, decide.ReasonQueueLimit) {
		t.Errorf("the difference does not say why the active controller holds it: %q", r.Entries[0].Active)
	}
	if got := testutil.ToFloat64(a.Shadow.differences.WithLabelValues(whatif.WouldAdmit)); got != 1 {
		t.Errorf("%s{kind=would-admit} = %v, want 1", MetricShadowDifferences, got)
	}
	if got := testutil.ToFloat64(a.Shadow.refused); got != 0 {
		t.Errorf("%v writes refused", got)
	}
}

func TestShadowOptions(t *testing.T) {
	o := Options{Shadow: true, WebhookPort: 9443, LeaderElectionID: "tessera-controller.tessera.dev", WebhookConfig: WebhookAuto, PinNodes: PinAll, ResyncPeriod: time.Second, ApplyWorkers: 1, ShadowReport: "r"}
	o.Complete(func(string) bool { return false })
	if o.WebhookPort != 0 || o.LeaderElectionID != DefaultShadowLease {
		t.Errorf("shadow: webhook port %d, lease %q", o.WebhookPort, o.LeaderElectionID)
	}
	if err := o.Validate(); err == nil || err.Error() != "--shadow needs --feature-gates=ShadowMode=true (the feature is alpha; see docs/compatibility.md#tesseras-feature-gates)" {
		t.Errorf("shadow with its gate at the default (off): %v", err)
	}
	o.Gates = testGates(t, "ShadowMode=true")
	if err := o.Validate(); err != nil {
		t.Error(err)
	}
	o.LeaderElectionID = "tessera-controller.tessera.dev"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "lease") {
		t.Errorf("shadow on the active lease: %v", err)
	}
}
