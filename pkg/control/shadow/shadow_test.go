package shadow

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/test/testutil"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/snapshot"
)

// TestShadowCompare: the shadow's previous decisions against what the
// active controller did since, as the pods show it.
func TestShadowCompare(t *testing.T) {
	pod := func(name string, gatedPod bool) *corev1.Pod {
		return decidetest.Pod("ns", name, decidetest.PodOptions{Queue: "q", Gated: gatedPod})
	}
	v := func(what, reason, name string) verdict {
		return verdict{what: what, reason: reason, message: "why-" + name, workload: "ns/" + name, queue: "q", pods: 1}
	}
	pods := []*corev1.Pod{
		decidetest.WithCondition(pod("admit-held", true), decide.ReasonQueueLimit),                                                // shadow admitted, still gated: would-admit
		decidetest.Admitted(pod("admit-done", false)),                                                                             // shadow admitted, active did too
		decidetest.Admitted(pod("hold-admitted", false)),                                                                          // shadow held, active admitted: would-hold
		decidetest.WithCondition(pod("hold-other", true), decide.ReasonDoesNotFit),                                                // both hold, other reasons
		decidetest.WithCondition(pod("hold-same", true), decide.ReasonQueueLimit),                                                 // both hold, same reason
		decidetest.Admitted(pod("evict-kept", false)),                                                                             // shadow would evict, still runs: would-reclaim
		decidetest.WithCondition(decidetest.Terminating(decidetest.Admitted(pod("kept-evicted", false))), decide.ReasonReclaimed), // active evicted: would-keep
		decidetest.WithCondition(decidetest.Terminating(decidetest.Admitted(pod("both-evicted", false))), decide.ReasonReclaimed), // both evicted
	}
	uid := func(name string) types.UID { return types.UID("uid-pod-ns-" + name) }
	prev := map[types.UID]verdict{
		uid("admit-held"):    v(admit, decide.ReasonAdmitted, "admit-held"),
		uid("admit-done"):    v(admit, decide.ReasonAdmitted, "admit-done"),
		uid("hold-admitted"): v(wait, decide.ReasonQueueLimit, "hold-admitted"),
		uid("hold-other"):    v(wait, decide.ReasonQueueLimit, "hold-other"),
		uid("hold-same"):     v(wait, decide.ReasonQueueLimit, "hold-same"),
		uid("evict-kept"):    v(evict, decide.ReasonReclaimed, "evict-kept"),
		uid("both-evicted"):  v(evict, decide.ReasonReclaimed, "both-evicted"),
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
		"ns/admit-held": WouldAdmit, "ns/hold-admitted": WouldHold, "ns/hold-other": OtherReason,
		"ns/evict-kept": WouldReclaim, "ns/kept-evicted": WouldKeep,
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
	var r Report
	for i := range MaxEntries + 10 {
		r.Add(time.Unix(int64(i), 0), []Difference{{Cycle: int64(i), Kind: WouldAdmit, Workload: "ns/p"}})
	}
	if len(r.Entries) != MaxEntries || r.Entries[0].Cycle != MaxEntries+9 {
		t.Fatalf("%d entries, newest cycle %d", len(r.Entries), r.Entries[0].Cycle)
	}
	if r.Totals[WouldAdmit] != MaxEntries+10 {
		t.Errorf("totals %v", r.Totals)
	}
	var out bytes.Buffer
	r.Print(&out, 5)
	if !strings.Contains(out.String(), "older differences") || !strings.Contains(out.String(), "+ shadow") {
		t.Errorf("print:\n%s", out.String())
	}
}

// TestGuardClientRefusesAllButReport: every write but the report's is
// refused with ErrWrite and counted, and reaches nothing.
func TestGuardClientRefusesAllButReport(t *testing.T) {
	ctx := context.Background()
	s := snapshot.Scheme()
	p := decidetest.Pod("ns", "p", decidetest.PodOptions{Queue: "q", Gated: true})
	q := decidetest.Queue("q", "", "1Gi", "")
	base := &testutil.WriteLog{Client: fake.NewClientBuilder().WithScheme(s).WithObjects(p, q).WithStatusSubresource(&corev1.Pod{}, &v1alpha1.Queue{}).Build()}
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
		if !errors.Is(err, ErrWrite) {
			t.Errorf("%s: %v, want ErrWrite", name, err)
		}
	}
	if refused != len(tries) {
		t.Errorf("%d refusals counted, want %d", refused, len(tries))
	}
	if len(base.Writes()) != 0 {
		t.Errorf("writes reached the API: %v", base.Writes())
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
