package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/test/testutil"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/shadow"
)

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
		decidetest.Admitted(decidetest.Pod("ns", "a", decidetest.PodOptions{Queue: "team-a", Claims: []string{"a-gpu"}, Created: t0})),
		decidetest.WithCondition(decidetest.Pod("ns", "b", decidetest.PodOptions{Queue: "team-a", Templates: []string{"gpu30"}, Gated: true, Created: t0}), decide.ReasonQueueLimit),
		decidetest.Claim("ns", "a-gpu", decidetest.Request{Memory: "30Gi"}),
	}
	for _, sl := range slices {
		objs = append(objs, sl)
	}
	for _, c := range decidetest.Classes() {
		objs = append(objs, c)
	}
	base := &testutil.WriteLog{Client: fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithStatusSubresource(&corev1.Pod{}, &v1alpha1.Queue{}).Build()}
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
	for _, w := range base.Writes() {
		if !strings.HasSuffix(w, " tessera/shadow-report") || !strings.HasPrefix(w, "create ") && !strings.HasPrefix(w, "update ") {
			t.Errorf("the shadow wrote %s", w)
		}
	}
	if len(base.Writes()) == 0 {
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
	r, err := shadow.Parse(cm.Data)
	if err != nil {
		t.Fatal(err)
	}
	if r.Cycles != 2 || len(r.Entries) != 1 || r.Entries[0].Kind != shadow.WouldAdmit || r.Entries[0].Workload != "ns/b" {
		t.Fatalf("report: %d cycles, entries %+v", r.Cycles, r.Entries)
	}
	if !strings.Contains(r.Entries[0].Active, decide.ReasonQueueLimit) {
		t.Errorf("the difference does not say why the active controller holds it: %q", r.Entries[0].Active)
	}
	if got := promtest.ToFloat64(a.Shadow.Differences(shadow.WouldAdmit)); got != 1 {
		t.Errorf("%s{kind=would-admit} = %v, want 1", shadow.MetricDifferences, got)
	}
	if got := promtest.ToFloat64(a.Shadow.Refused()); got != 0 {
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
