package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/whatif"
)

// Shadow mode (--shadow): the controller watches and decides every cycle
// with its own flags and queue settings, writes nothing but its report
// (one ConfigMap), and compares its decisions with what the active
// controller did, as observed on the pods:
//   - a workload the shadow admitted in its previous cycle that is still
//     gated now: would-admit (the active controller holds it);
//   - a workload the shadow held that the active controller ungated since:
//     would-hold;
//   - a workload the shadow would evict that still runs: would-reclaim;
//   - a workload the active controller evicted (its condition says
//     Reclaimed or OverLimit) that the shadow would keep: would-keep;
//   - both hold a workload, for different reasons: other-reason.
//
// Comparing the shadow's previous decision with the pods' state now gives
// the active controller a cycle's time to act; the first cycle reports
// nothing. A difference is reported once per workload until it goes away.

// Shadow metric names.
const (
	MetricShadowDifferences      = "tessera_shadow_differences_total"
	MetricShadowCycleDifferences = "tessera_shadow_cycle_differences"
	MetricShadowCycles           = "tessera_shadow_cycles_total"
	MetricShadowRefusedWrites    = "tessera_shadow_refused_writes_total"
)

// DefaultShadowLease is the shadow's leader-election lease: never the
// active controller's.
const DefaultShadowLease = "tessera-shadow.tessera.dev"

// ErrShadowWrite is what the shadow's client answers to any write but its
// report.
var ErrShadowWrite = errors.New("shadow mode: the shadow controller writes nothing but its report")

// shadowVerdict is what the shadow decided for one pod in a cycle.
type shadowVerdict struct {
	what, reason, message string
	workload, queue       string
	pods                  int
}

// Shadow compares a shadow controller's decisions with the active one's
// and keeps the report.
type Shadow struct {
	// Client writes the report (the guarded client: nothing else).
	Client client.Client
	// Namespace and Name are the report's ConfigMap.
	Namespace, Name string
	// Settings describe the shadow in its report.
	Settings string
	// Queues replace the cluster's queues of the same name in the shadow's
	// decisions (--shadow-queues).
	Queues []*v1alpha1.Queue
	// WriteEvery bounds how long the report goes unwritten while nothing
	// differs (its cycle count and time still move).
	WriteEvery time.Duration

	mu        sync.Mutex
	prev      map[types.UID]shadowVerdict
	running   map[types.UID]bool
	reported  map[types.UID]string
	report    whatif.ShadowReport
	loaded    bool
	lastWrite time.Time

	differences *prometheus.CounterVec
	last        *prometheus.GaugeVec
	cycles      prometheus.Counter
	refused     prometheus.Counter
}

// NewShadow registers the shadow's metrics with reg.
func NewShadow(reg prometheus.Registerer, namespace, name string) *Shadow {
	s := &Shadow{
		Namespace: namespace, Name: name, WriteEvery: 30 * time.Second,
		differences: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricShadowDifferences,
			Help: "Workloads the shadow controller decided otherwise than the active one, by kind (would-admit, would-hold, would-reclaim, would-keep, other-reason)."}, []string{"kind"}),
		last: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricShadowCycleDifferences,
			Help: "Differences found by the shadow controller's last cycle, by kind."}, []string{"kind"}),
		cycles:  prometheus.NewCounter(prometheus.CounterOpts{Name: MetricShadowCycles, Help: "Admission cycles the shadow controller compared."}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricShadowRefusedWrites, Help: "Writes the shadow controller's client refused (any is a bug)."}),
	}
	for _, k := range whatif.DifferenceKinds {
		s.differences.WithLabelValues(k)
		s.last.WithLabelValues(k)
	}
	if reg != nil {
		reg.MustRegister(s.differences, s.last, s.cycles, s.refused)
	}
	return s
}

// queues are the queues the shadow decides with.
func (s *Shadow) queues(current []*v1alpha1.Queue) []*v1alpha1.Queue {
	if len(s.Queues) == 0 {
		return current
	}
	return whatif.WithQueues(current, s.Queues)
}

// verdicts are a decision's outcome per pod.
func verdicts(d *decide.Decision) map[types.UID]shadowVerdict {
	out := map[types.UID]shadowVerdict{}
	for _, a := range d.Admit {
		for _, p := range a.Pods {
			out[p.UID] = shadowVerdict{what: whatif.Start, reason: decide.ReasonAdmitted, message: a.Message, workload: a.Workload.Key, queue: a.Workload.QueueName, pods: len(a.Pods)}
		}
	}
	for _, v := range d.Waiting {
		for _, p := range v.Workload.Pods {
			out[p.UID] = shadowVerdict{what: whatif.Wait, reason: v.Reason, message: v.Message, workload: v.Workload.Key, queue: v.Workload.QueueName, pods: len(v.Workload.Pods)}
		}
	}
	for _, e := range d.Evict {
		reason := e.Reason
		if reason == "" {
			reason = decide.ReasonReclaimed
		}
		for _, p := range e.Pods {
			out[p.UID] = shadowVerdict{what: whatif.Reclaim, reason: reason, message: e.Message, workload: e.Workload.Key, queue: e.Workload.QueueName, pods: len(e.Pods)}
		}
	}
	return out
}

func activeSays(p *corev1.Pod) string {
	c := podCondition(p)
	if c == nil {
		return "no decision written yet"
	}
	if c.Message == "" {
		return c.Reason
	}
	return c.Reason + ": " + c.Message
}

func says(v shadowVerdict) string {
	if v.message == "" {
		return v.reason
	}
	return v.reason + ": " + v.message
}

// compare finds the differences between the shadow's previous decisions
// (prev, per pod) and what the active controller did, as the pods show
// now; running are the pods that ran (admitted, not terminating) at the
// previous cycle. reported (per pod: the difference last reported) is
// updated so that a difference is reported once.
func compare(prev map[types.UID]shadowVerdict, running map[types.UID]bool, reported map[types.UID]string, pods []*corev1.Pod, now time.Time, cycle int64) []whatif.Difference {
	found := map[string]*whatif.Difference{}
	seen := map[types.UID]bool{}
	add := func(p *corev1.Pod, kind, queue, workload string, n int, shadow, active string) {
		key := kind + "|" + shadow
		if reported[p.UID] == key {
			return
		}
		reported[p.UID] = key
		if d := found[kind+"|"+workload]; d != nil {
			return
		}
		found[kind+"|"+workload] = &whatif.Difference{Time: now, Cycle: cycle, Kind: kind, Queue: queue, Workload: workload, Pods: n, Shadow: shadow, Active: active}
	}
	for _, p := range pods {
		seen[p.UID] = true
		gated := decide.HasAdmissionGate(p) && p.DeletionTimestamp == nil
		c := podCondition(p)
		v, decided := prev[p.UID]
		switch {
		case decided && v.what == whatif.Start && gated:
			add(p, whatif.WouldAdmit, v.queue, v.workload, v.pods, "admit ("+says(v)+")", "holds it: "+activeSays(p))
		case decided && v.what == whatif.Wait && !decide.HasAdmissionGate(p) && p.DeletionTimestamp == nil && p.Annotations[v1alpha1.AdmittedAtAnnotation] != "":
			add(p, whatif.WouldHold, v.queue, v.workload, v.pods, "hold: "+says(v), "admitted it")
		case decided && v.what == whatif.Wait && gated && c != nil && c.Status == corev1.ConditionFalse && c.Reason != v.reason:
			add(p, whatif.OtherReason, v.queue, v.workload, v.pods, "hold: "+says(v), "holds it: "+activeSays(p))
		case decided && v.what == whatif.Reclaim && p.DeletionTimestamp == nil:
			add(p, whatif.WouldReclaim, v.queue, v.workload, v.pods, "evict: "+says(v), "keeps it running")
		case (!decided || v.what != whatif.Reclaim) && running[p.UID] && p.DeletionTimestamp != nil && c != nil && c.Status == corev1.ConditionFalse &&
			(c.Reason == decide.ReasonReclaimed || c.Reason == decide.ReasonOverLimit):
			add(p, whatif.WouldKeep, p.Labels[v1alpha1.QueueLabel], workloadOf(p), 1, "keep it running", "evicted it: "+activeSays(p))
		default:
			delete(reported, p.UID) // agreement (again)
		}
	}
	for uid := range reported {
		if !seen[uid] {
			delete(reported, uid)
		}
	}
	out := make([]whatif.Difference, 0, len(found))
	for _, d := range found {
		out = append(out, *d)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Workload < out[j].Workload
	})
	return out
}

// workloadOf names a pod's workload as the engine does for an admitted one.
func workloadOf(p *corev1.Pod) string {
	if g := p.Labels[v1alpha1.GangLabel]; g != "" {
		return p.Namespace + "/" + g
	}
	return p.Namespace + "/" + p.Name
}

// runningPods are the admitted pods that are not terminating.
func runningPods(pods []*corev1.Pod) map[types.UID]bool {
	out := map[types.UID]bool{}
	for _, p := range pods {
		if !decide.HasAdmissionGate(p) && p.DeletionTimestamp == nil {
			out[p.UID] = true
		}
	}
	return out
}

// Cycle compares one shadow cycle, counts the differences and writes the
// report. The engine forgets what the cycle admitted: nothing was ungated.
func (s *Shadow) Cycle(ctx context.Context, e *decide.Engine, snap *decide.Snapshot, d *decide.Decision) []whatif.Difference {
	var admitted []*corev1.Pod
	for _, a := range d.Admit {
		admitted = append(admitted, a.Pods...)
	}
	e.Forget(admitted...)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reported == nil {
		s.reported = map[types.UID]string{}
	}
	if !s.loaded {
		s.load(ctx)
	}
	now := time.Now()
	diffs := compare(s.prev, s.running, s.reported, snap.Pods, now, s.report.Cycles+1)
	s.prev, s.running = verdicts(d), runningPods(snap.Pods)
	s.report.Settings = s.Settings
	s.report.Add(now, diffs)
	s.cycles.Inc()
	for _, k := range whatif.DifferenceKinds {
		s.last.WithLabelValues(k).Set(float64(s.report.Last[k]))
		if n := s.report.Last[k]; n > 0 {
			s.differences.WithLabelValues(k).Add(float64(n))
		}
	}
	for _, df := range diffs {
		klog.FromContext(ctx).V(2).Info("Shadow differs", "kind", df.Kind, "queue", df.Queue, "workload", df.Workload, "shadow", df.Shadow, "active", df.Active)
	}
	if len(diffs) > 0 || now.Sub(s.lastWrite) >= s.WriteEvery {
		if err := s.write(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Writing the shadow report failed; retrying next cycle", "configMap", s.Namespace+"/"+s.Name)
		} else {
			s.lastWrite = now
		}
	}
	return diffs
}

// load continues the report a previous shadow process left.
func (s *Shadow) load(ctx context.Context) {
	var cm corev1.ConfigMap
	if err := s.Client.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, &cm); err == nil {
		if r, err := whatif.ParseShadowReport(cm.Data); err == nil {
			s.report = *r
		}
	}
	s.loaded = true
}

// write stores the report in its ConfigMap (created when missing).
func (s *Shadow) write(ctx context.Context) error {
	data, err := s.report.Marshal()
	if err != nil {
		return err
	}
	// A ConfigMap holds at most 1MiB: drop the oldest entries until the
	// report fits with room to spare.
	for len(data) > 512*1024 && len(s.report.Entries) > 0 {
		s.report.Entries = s.report.Entries[:len(s.report.Entries)/2]
		if data, err = s.report.Marshal(); err != nil {
			return err
		}
	}
	var cm corev1.ConfigMap
	err = s.Client.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, &cm)
	if apierrors.IsNotFound(err) {
		cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name,
			Labels: map[string]string{"app.kubernetes.io/component": "shadow-report"}},
			Data: map[string]string{whatif.ShadowReportKey: data}}
		return s.Client.Create(ctx, &cm)
	}
	if err != nil {
		return err
	}
	cm.Data = map[string]string{whatif.ShadowReportKey: data}
	return s.Client.Update(ctx, &cm)
}

// ShadowSettings describe a shadow controller in its report.
func ShadowSettings(o Options) string {
	image := os.Getenv("TESSERA_IMAGE")
	parts := []string{fmt.Sprintf("reclaim=%v", o.Reclaim), fmt.Sprintf("max-reclaims-per-cycle=%d", o.MaxReclaimsPerCycle)}
	if o.KubernetesVersion != "" {
		parts = append(parts, "kubernetes-version="+o.KubernetesVersion)
	}
	if o.SchedulerFeatureGates != "" {
		parts = append(parts, "scheduler-feature-gates="+o.SchedulerFeatureGates)
	}
	if o.ShadowQueues != "" {
		parts = append(parts, "queues from "+o.ShadowQueues)
	}
	if image != "" {
		parts = append([]string{"image " + image}, parts...)
	}
	return strings.Join(parts, ", ")
}

// guardClient is the shadow's client: it reads everything and refuses
// every write except to its report ConfigMap, loudly (an error, a log
// line and tessera_shadow_refused_writes_total).
type guardClient struct {
	client.Client
	namespace, name string
	refused         func()
}

// NewGuardClient wraps c so that it writes only the ConfigMap
// namespace/name. refused (may be nil) is called on every refused write.
func NewGuardClient(c client.Client, namespace, name string, refused func()) client.Client {
	return &guardClient{Client: c, namespace: namespace, name: name, refused: refused}
}

func (g *guardClient) allowed(obj any) error {
	if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Namespace == g.namespace && cm.Name == g.name {
		return nil
	}
	if r, ok := obj.(refuseAll); ok {
		obj = r.Object
	}
	what := "an apply configuration"
	if o, ok := obj.(client.Object); ok {
		what = fmt.Sprintf("%T %s/%s", obj, o.GetNamespace(), o.GetName())
	}
	if g.refused != nil {
		g.refused()
	}
	klog.Background().Error(ErrShadowWrite, "Refused a write", "object", what, "report", g.namespace+"/"+g.name)
	return fmt.Errorf("%w: refused to write %s", ErrShadowWrite, what)
}

func (g *guardClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if err := g.allowed(obj); err != nil {
		return err
	}
	return g.Client.Create(ctx, obj, opts...)
}

func (g *guardClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := g.allowed(obj); err != nil {
		return err
	}
	return g.Client.Update(ctx, obj, opts...)
}

func (g *guardClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if err := g.allowed(obj); err != nil {
		return err
	}
	return g.Client.Patch(ctx, obj, patch, opts...)
}

func (g *guardClient) Delete(ctx context.Context, obj client.Object, _ ...client.DeleteOption) error {
	return g.allowed(refuseAll{obj})
}

func (g *guardClient) DeleteAllOf(ctx context.Context, obj client.Object, _ ...client.DeleteAllOfOption) error {
	return g.allowed(refuseAll{obj})
}

func (g *guardClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, _ ...client.ApplyOption) error {
	return g.allowed(nil)
}

func (g *guardClient) Status() client.SubResourceWriter { return guardSub{g, "status"} }

func (g *guardClient) SubResource(sub string) client.SubResourceClient {
	return guardSub{g, sub}
}

// refuseAll is an object no write of which is allowed (deletes: the report
// is never deleted).
type refuseAll struct{ client.Object }

// guardSub refuses every subresource write (status, eviction, binding...).
type guardSub struct {
	g   *guardClient
	sub string
}

func (s guardSub) Get(ctx context.Context, obj client.Object, subResource client.Object, opts ...client.SubResourceGetOption) error {
	return s.g.Client.SubResource(s.sub).Get(ctx, obj, subResource, opts...)
}

func (s guardSub) Create(_ context.Context, obj client.Object, _ client.Object, _ ...client.SubResourceCreateOption) error {
	return s.g.allowed(refuseAll{obj})
}

func (s guardSub) Update(_ context.Context, obj client.Object, _ ...client.SubResourceUpdateOption) error {
	return s.g.allowed(refuseAll{obj})
}

func (s guardSub) Patch(_ context.Context, obj client.Object, _ client.Patch, _ ...client.SubResourcePatchOption) error {
	return s.g.allowed(refuseAll{obj})
}

func (s guardSub) Apply(_ context.Context, _ runtime.ApplyConfiguration, _ ...client.SubResourceApplyOption) error {
	return s.g.allowed(nil)
}

// noEvents is the shadow's event recorder: it records nothing.
type noEvents struct{}

func (noEvents) Eventf(runtime.Object, runtime.Object, string, string, string, string, ...any) {}
func (noEvents) AnnotatedEventf(runtime.Object, runtime.Object, map[string]string, string, string, string, string, ...any) {
}

// makeShadow makes the reconciler a shadow: its client writes nothing
// but the report (reads go to the API directly), no events.
func makeShadow(a *Reconciler, direct client.Client, o Options) error {
	s := NewShadow(registry(o), o.Namespace, o.ShadowReport)
	s.Client = NewGuardClient(direct, o.Namespace, o.ShadowReport, s.refused.Inc)
	s.Settings = ShadowSettings(o)
	if o.ShadowQueues != "" {
		f, err := os.Open(o.ShadowQueues)
		if err != nil {
			return fmt.Errorf("--shadow-queues: %w", err)
		}
		defer f.Close()
		if s.Queues, err = whatif.ReadQueues(f); err != nil {
			return fmt.Errorf("--shadow-queues %s: %w", o.ShadowQueues, err)
		}
	}
	a.Shadow = s
	a.Client = s.Client
	a.Recorder = noEvents{}
	return nil
}
