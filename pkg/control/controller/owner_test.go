package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/test/testutil"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
)

// TestCanaryOwnership runs the main and a canary controller over one fake
// API: each decides and writes only its own trees' pods and queues, a
// child queue that names the other controller stays with its root's (and
// says so), and the canary's placement counts the devices the main
// controller's running pod holds.
func TestCanaryOwnership(t *testing.T) {
	ctx := context.Background()
	s, err := NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	slices, err := decidetest.NodeSlices("n1", decidetest.NodeOptions{Profile: "h100-80gb:1"})
	if err != nil {
		t.Fatal(err)
	}
	named := func(q *v1alpha1.Queue, controller string) *v1alpha1.Queue {
		q.Spec.ControllerName = controller
		return q
	}
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	objs := []client.Object{
		decidetest.Queue("prod", "", "", ""),
		decidetest.Queue("prod-a", "prod", "80Gi", "80Gi"),
		named(decidetest.Queue("prod-b", "prod", "80Gi", "80Gi"), "canary"), // a split: refused
		named(decidetest.Queue("exp", "", "80Gi", "80Gi"), "canary"),
		decidetest.Node("n1"),
		// The main controller's running pod holds 40Gi of the one GPU.
		decidetest.Admitted(decidetest.Pod("ns", "run-prod", decidetest.PodOptions{Queue: "prod-a", Claims: []string{"run-prod-gpu"}, Created: t0})),
		decidetest.Claim("ns", "run-prod-gpu", decidetest.Request{Memory: "40Gi"}),
		decidetest.Pod("ns", "g-prod", decidetest.PodOptions{Queue: "prod-a", Claims: []string{"g-prod-gpu"}, Gated: true, Created: t0}),
		decidetest.Claim("ns", "g-prod-gpu", decidetest.Request{Memory: "10Gi"}),
		decidetest.Pod("ns", "g-split", decidetest.PodOptions{Queue: "prod-b", Claims: []string{"g-split-gpu"}, Gated: true, Created: t0}),
		decidetest.Claim("ns", "g-split-gpu", decidetest.Request{Memory: "10Gi"}),
		// The canary's: one fits beside run-prod, one (50Gi) does not.
		decidetest.Pod("ns", "g-exp", decidetest.PodOptions{Queue: "exp", Claims: []string{"g-exp-gpu"}, Gated: true, Created: t0}),
		decidetest.Claim("ns", "g-exp-gpu", decidetest.Request{Memory: "10Gi"}),
		decidetest.Pod("ns", "g-exp-big", decidetest.PodOptions{Queue: "exp", Claims: []string{"g-exp-big-gpu"}, Gated: true, Created: t0}),
		decidetest.Claim("ns", "g-exp-big-gpu", decidetest.Request{Memory: "50Gi"}),
	}
	for _, sl := range slices {
		objs = append(objs, sl)
	}
	for _, c := range decidetest.Classes() {
		c.UID = types.UID("uid-class-" + c.Name) // the fake API sets none; reuse keys by UID
		objs = append(objs, c)
	}
	for _, o := range objs {
		if o.GetUID() == "" {
			o.SetUID(types.UID("uid-" + o.GetName()))
		}
	}
	base := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithStatusSubresource(&corev1.Pod{}, &v1alpha1.Queue{}).Build()
	reconciler := func(name string) (*Reconciler, *testutil.WriteLog) {
		w := &testutil.WriteLog{Client: base}
		return &Reconciler{Client: w, Reader: base, Recorder: events.NewFakeRecorder(100),
			Engine:  decide.NewEngine(decide.Config{Reclaim: true, MaxReclaimsPerCycle: 16, Features: allocation.SchedulerFeatures}),
			Metrics: NewMetrics(prometheus.NewRegistry()),
			Opts:    Options{ControllerName: name, ApplyWorkers: 2, MaxReasonUpdates: 100, ResyncPeriod: time.Nanosecond, PinNodes: PinNone}}, w
	}
	pod := func(name string) *corev1.Pod {
		var p corev1.Pod
		if err := base.Get(ctx, types.NamespacedName{Namespace: "ns", Name: name}, &p); err != nil {
			t.Fatal(err)
		}
		return &p
	}
	written := func(w *testutil.WriteLog) map[string]bool {
		out := map[string]bool{}
		for _, x := range w.Writes() {
			f := strings.Fields(x)
			out[f[len(f)-1]] = true
		}
		return out
	}

	canary, cw := reconciler("canary")
	if _, err := canary.Reconcile(ctx, CycleRequest); err != nil {
		t.Fatal(err)
	}
	if p := pod("g-exp"); decide.HasAdmissionGate(p) || p.Annotations[v1alpha1.AdmittedByAnnotation] != "canary" {
		t.Errorf("g-exp: gates %v, annotations %v; want it admitted by canary", p.Spec.SchedulingGates, p.Annotations)
	}
	if c := decide.AdmissionCondition(pod("g-exp-big")); c == nil || c.Reason != decide.ReasonDoesNotFit {
		t.Errorf("g-exp-big does not fit beside the main controller's running pod; condition %+v", c)
	}
	for _, n := range []string{"g-prod", "g-split"} {
		if p := pod(n); !decide.HasAdmissionGate(p) || len(p.Status.Conditions) != 0 {
			t.Errorf("the canary touched the main controller's pod %s: gates %v, conditions %v", n, p.Spec.SchedulingGates, p.Status.Conditions)
		}
	}
	for w := range written(cw) {
		if !strings.HasPrefix(w, "ns/g-exp") && w != "/exp" {
			t.Errorf("the canary wrote %s", w)
		}
	}

	main, mw := reconciler("")
	if _, err := main.Reconcile(ctx, CycleRequest); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"g-prod", "g-split"} {
		if p := pod(n); decide.HasAdmissionGate(p) || p.Annotations[v1alpha1.AdmittedByAnnotation] != v1alpha1.DefaultControllerName {
			t.Errorf("%s: gates %v, annotations %v; want it admitted by the main controller", n, p.Spec.SchedulingGates, p.Annotations)
		}
	}
	for w := range written(mw) {
		if strings.HasPrefix(w, "ns/g-exp") || w == "/exp" || w == "ns/run-prod" {
			t.Errorf("the main controller wrote %s", w)
		}
	}
	var q v1alpha1.Queue
	if err := base.Get(ctx, types.NamespacedName{Name: "prod-b"}, &q); err != nil {
		t.Fatal(err)
	}
	c := meta.FindStatusCondition(q.Status.Conditions, v1alpha1.QueueConditionControllerAssigned)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonSplitRefused || !strings.Contains(c.Message, "set spec.controllerName on prod") {
		t.Errorf("prod-b: ControllerAssigned %+v, want False SplitRefused naming the fix", c)
	}
	if err := base.Get(ctx, types.NamespacedName{Name: "exp"}, &q); err != nil {
		t.Fatal(err)
	}
	c = meta.FindStatusCondition(q.Status.Conditions, v1alpha1.QueueConditionControllerAssigned)
	if c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, `"canary"`) {
		t.Errorf("exp: ControllerAssigned %+v, want True naming canary", c)
	}
	if p := pod("run-prod"); p.Annotations[v1alpha1.AdmittedByAnnotation] != "" || len(p.Status.Conditions) != 0 {
		t.Errorf("a running pod was written to: %v %v", p.Annotations, p.Status.Conditions)
	}

	// The rollback: exp's field removed. A new pod there is the main
	// controller's; the pod the canary admitted runs on untouched.
	if err := base.Get(ctx, types.NamespacedName{Name: "exp"}, &q); err != nil {
		t.Fatal(err)
	}
	q.Spec.ControllerName = ""
	if err := base.Update(ctx, &q); err != nil {
		t.Fatal(err)
	}
	if err := base.Create(ctx, decidetest.Claim("ns", "g-exp2-gpu", decidetest.Request{Memory: "4Gi"})); err != nil {
		t.Fatal(err)
	}
	g2 := decidetest.Pod("ns", "g-exp2", decidetest.PodOptions{Queue: "exp", Claims: []string{"g-exp2-gpu"}, Gated: true, Created: t0})
	g2.ResourceVersion = ""
	if err := base.Create(ctx, g2); err != nil {
		t.Fatal(err)
	}
	admittedAt := pod("g-exp").Annotations[v1alpha1.AdmittedAtAnnotation]
	cw.Reset()
	mw.Reset()
	if _, err := canary.Reconcile(ctx, CycleRequest); err != nil {
		t.Fatal(err)
	}
	if len(cw.Writes()) != 0 {
		t.Errorf("the canary wrote after its only tree moved away: %v", cw.Writes())
	}
	if _, err := main.Reconcile(ctx, CycleRequest); err != nil {
		t.Fatal(err)
	}
	if p := pod("g-exp2"); decide.HasAdmissionGate(p) || p.Annotations[v1alpha1.AdmittedByAnnotation] != v1alpha1.DefaultControllerName {
		t.Errorf("g-exp2 after the rollback: gates %v, annotations %v, condition %+v; want it admitted by the main controller", p.Spec.SchedulingGates, p.Annotations, decide.AdmissionCondition(p))
	}
	if written(mw)["ns/g-exp"] {
		t.Error("the main controller wrote to the running pod the canary admitted")
	}
	if p := pod("g-exp"); p.Annotations[v1alpha1.AdmittedByAnnotation] != "canary" || p.Annotations[v1alpha1.AdmittedAtAnnotation] != admittedAt {
		t.Errorf("g-exp after the rollback: %v", p.Annotations)
	}
}

func TestCanaryOptions(t *testing.T) {
	base := Options{WebhookPort: 9443, LeaderElectionID: "tessera-controller.tessera.dev", WebhookConfig: WebhookURL, PinNodes: PinAll, ResyncPeriod: time.Second, ApplyWorkers: 1,
		Gates: testGates(t, "CanaryControllers=true")}
	o := base
	o.ControllerName = "canary"
	o.Complete(func(string) bool { return false })
	if o.WebhookPort != 0 || o.LeaderElectionID != "tessera-controller-canary.tessera.dev" {
		t.Errorf("canary: webhook port %d, lease %q", o.WebhookPort, o.LeaderElectionID)
	}
	if err := o.Validate(); err != nil {
		t.Error(err)
	}
	tests := []struct {
		name   string
		mutate func(*Options)
		want   string // "" = valid
	}{
		{"main", func(o *Options) { o.ControllerName = "default" }, ""},
		{"empty is main", func(o *Options) { o.ControllerName = "" }, ""},
		{"not a DNS label", func(o *Options) { o.ControllerName = "Canary_1" }, "--controller-name"},
		{"canary with webhooks", func(o *Options) { o.ControllerName = "canary" }, "--webhook-port"},
		{"canary on the main lease", func(o *Options) { o.ControllerName = "canary"; o.WebhookPort = 0 }, "lease"},
		{"canary, gate at its default (off)", func(o *Options) {
			o.ControllerName, o.WebhookPort, o.LeaderElectionID, o.Gates = "canary", 0, "tessera-controller-canary.tessera.dev", nil
		}, "--controller-name=canary needs --feature-gates=CanaryControllers=true"},
		{"main, gate off", func(o *Options) { o.ControllerName, o.Gates = "default", nil }, ""},
		{"reclaim grace period 30s", func(o *Options) { o.ControllerName, o.ReclaimGracePeriod = "default", 30*time.Second }, ""},
		{"reclaim grace period unset: the default", func(o *Options) { o.ControllerName, o.ReclaimGracePeriod = "default", 0 }, ""},
		{"reclaim grace period under a second", func(o *Options) { o.ControllerName, o.ReclaimGracePeriod = "default", 500*time.Millisecond }, "--reclaim-grace-period=500ms must be between 1s and 1h"},
		{"reclaim grace period over an hour", func(o *Options) { o.ControllerName, o.ReclaimGracePeriod = "default", 2*time.Hour }, "--reclaim-grace-period=2h0m0s must be between 1s and 1h"},
		{"negative reclaim grace period", func(o *Options) { o.ControllerName, o.ReclaimGracePeriod = "default", -time.Second }, "--reclaim-grace-period"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := base
			tt.mutate(&o)
			err := o.Validate()
			if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("Validate() = %v, want %q", err, tt.want)
			}
		})
	}
}
