package shadow

import (
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"context"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/whatif"
)

// Shadow metric names.
const (
	MetricDifferences      = "tessera_shadow_differences_total"
	MetricCycleDifferences = "tessera_shadow_cycle_differences"
	MetricCycles           = "tessera_shadow_cycles_total"
	MetricRefusedWrites    = "tessera_shadow_refused_writes_total"
)

// verdict is what the shadow decided for one pod in a cycle.
type verdict struct {
	what, reason, message string
	workload, queue       string
	pods                  int
}

// Tracker compares a shadow controller's decisions with the active one's
// and keeps the report.
type Tracker struct {
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
	prev      map[types.UID]verdict
	running   map[types.UID]bool
	reported  map[types.UID]string
	report    Report
	loaded    bool
	lastWrite time.Time

	differences *prometheus.CounterVec
	last        *prometheus.GaugeVec
	cycles      prometheus.Counter
	refused     prometheus.Counter
}

// NewTracker registers the shadow's metrics with reg; its Client is
// direct guarded (NewGuardClient): it writes the report namespace/name
// and nothing else.
func NewTracker(reg prometheus.Registerer, direct client.Client, namespace, name string) *Tracker {
	s := &Tracker{
		Namespace: namespace, Name: name, WriteEvery: 30 * time.Second,
		differences: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricDifferences,
			Help: "Workloads the shadow controller decided otherwise than the active one, by kind (would-admit, would-hold, would-reclaim, would-keep, other-reason)."}, []string{"kind"}),
		last: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricCycleDifferences,
			Help: "Differences found by the shadow controller's last cycle, by kind."}, []string{"kind"}),
		cycles:  prometheus.NewCounter(prometheus.CounterOpts{Name: MetricCycles, Help: "Admission cycles the shadow controller compared."}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricRefusedWrites, Help: "Writes the shadow controller's client refused (any is a bug)."}),
	}
	s.Client = NewGuardClient(direct, namespace, name, s.refused.Inc)
	for _, k := range DifferenceKinds {
		s.differences.WithLabelValues(k)
		s.last.WithLabelValues(k)
	}
	if reg != nil {
		reg.MustRegister(s.differences, s.last, s.cycles, s.refused)
	}
	return s
}

// WithQueues are the queues the shadow decides with: the cluster's
// (current), Queues replacing those of the same name.
func (s *Tracker) WithQueues(current []*v1alpha1.Queue) []*v1alpha1.Queue {
	if len(s.Queues) == 0 {
		return current
	}
	return whatif.WithQueues(current, s.Queues)
}

// What the shadow decided for a pod.
const (
	admit = "admit"
	wait  = "wait"
	evict = "evict"
)

// verdicts are a decision's outcome per pod.
func verdicts(d *decide.Decision) map[types.UID]verdict {
	out := map[types.UID]verdict{}
	for _, a := range d.Admit {
		for _, p := range a.Pods {
			out[p.UID] = verdict{what: admit, reason: decide.ReasonAdmitted, message: a.Message, workload: a.Workload.Key, queue: a.Workload.QueueName, pods: len(a.Pods)}
		}
	}
	for _, v := range d.Waiting {
		for _, p := range v.Workload.Pods {
			out[p.UID] = verdict{what: wait, reason: v.Reason, message: v.Message, workload: v.Workload.Key, queue: v.Workload.QueueName, pods: len(v.Workload.Pods)}
		}
	}
	for _, e := range d.Evict {
		reason := e.Reason
		if reason == "" {
			reason = decide.ReasonReclaimed
		}
		for _, p := range e.Pods {
			out[p.UID] = verdict{what: evict, reason: reason, message: e.Message, workload: e.Workload.Key, queue: e.Workload.QueueName, pods: len(e.Pods)}
		}
	}
	return out
}

func activeSays(p *corev1.Pod) string {
	c := decide.AdmissionCondition(p)
	if c == nil {
		return "no decision written yet"
	}
	if c.Message == "" {
		return c.Reason
	}
	return c.Reason + ": " + c.Message
}

func says(v verdict) string {
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
func compare(prev map[types.UID]verdict, running map[types.UID]bool, reported map[types.UID]string, pods []*corev1.Pod, now time.Time, cycle int64) []Difference {
	found := map[string]*Difference{}
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
		found[kind+"|"+workload] = &Difference{Time: now, Cycle: cycle, Kind: kind, Queue: queue, Workload: workload, Pods: n, Shadow: shadow, Active: active}
	}
	for _, p := range pods {
		seen[p.UID] = true
		gated := decide.HasAdmissionGate(p) && p.DeletionTimestamp == nil
		c := decide.AdmissionCondition(p)
		v, decided := prev[p.UID]
		switch {
		case decided && v.what == admit && gated:
			add(p, WouldAdmit, v.queue, v.workload, v.pods, "admit ("+says(v)+")", "holds it: "+activeSays(p))
		case decided && v.what == wait && !decide.HasAdmissionGate(p) && p.DeletionTimestamp == nil && p.Annotations[v1alpha1.AdmittedAtAnnotation] != "":
			add(p, WouldHold, v.queue, v.workload, v.pods, "hold: "+says(v), "admitted it")
		case decided && v.what == wait && gated && c != nil && c.Status == corev1.ConditionFalse && c.Reason != v.reason:
			add(p, OtherReason, v.queue, v.workload, v.pods, "hold: "+says(v), "holds it: "+activeSays(p))
		case decided && v.what == evict && p.DeletionTimestamp == nil:
			add(p, WouldReclaim, v.queue, v.workload, v.pods, "evict: "+says(v), "keeps it running")
		case (!decided || v.what != evict) && running[p.UID] && p.DeletionTimestamp != nil && c != nil && c.Status == corev1.ConditionFalse &&
			(c.Reason == decide.ReasonReclaimed || c.Reason == decide.ReasonOverLimit):
			add(p, WouldKeep, p.Labels[v1alpha1.QueueLabel], workloadOf(p), 1, "keep it running", "evicted it: "+activeSays(p))
		default:
			delete(reported, p.UID) // agreement (again)
		}
	}
	for uid := range reported {
		if !seen[uid] {
			delete(reported, uid)
		}
	}
	out := make([]Difference, 0, len(found))
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
func (s *Tracker) Cycle(ctx context.Context, e *decide.Engine, snap *decide.Snapshot, d *decide.Decision) []Difference {
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
	for _, k := range DifferenceKinds {
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
func (s *Tracker) load(ctx context.Context) {
	var cm corev1.ConfigMap
	if err := s.Client.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, &cm); err == nil {
		if r, err := Parse(cm.Data); err == nil {
			s.report = *r
		}
	}
	s.loaded = true
}

// write stores the report in its ConfigMap (created when missing).
func (s *Tracker) write(ctx context.Context) error {
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
			Data: map[string]string{ReportKey: data}}
		return s.Client.Create(ctx, &cm)
	}
	if err != nil {
		return err
	}
	cm.Data = map[string]string{ReportKey: data}
	return s.Client.Update(ctx, &cm)
}

// Differences is the counter of differences of kind found since start.
func (s *Tracker) Differences(kind string) prometheus.Counter {
	return s.differences.WithLabelValues(kind)
}

// Refused is the counter of writes the guard refused (any is a bug).
func (s *Tracker) Refused() prometheus.Counter { return s.refused }
