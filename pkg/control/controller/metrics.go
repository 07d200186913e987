package controller

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
)

// Metric names the controller exports (docs/observability.md; the Grafana
// dashboard's test checks its queries against them).
const (
	MetricCycleSeconds            = "tessera_admission_cycle_seconds"
	MetricWorkloads               = "tessera_admission_workloads"
	MetricAdmittedTotal           = "tessera_admitted_workloads_total"
	MetricReclaimedTotal          = "tessera_reclaimed_workloads_total"
	MetricQueuePendingWorkloads   = "tessera_queue_pending_workloads"
	MetricQueueAdmittedWorkloads  = "tessera_queue_admitted_workloads_total"
	MetricQueueAdmissionWait      = "tessera_queue_admission_wait_time_seconds"
	MetricQueueResourceUsage      = "tessera_queue_resource_usage"
	MetricQueueQuota              = "tessera_queue_quota"
	MetricQueueLimit              = "tessera_queue_limit"
	MetricQueueFairShare          = "tessera_queue_fair_share"
	MetricQueueEvictedWorkloads   = "tessera_queue_evicted_workloads_total"
	MetricQueueMemoryUsedBytes    = "tessera_queue_memory_used_bytes"
	MetricInadmissibleWorkloads   = "tessera_controller_inadmissible_workloads"
	MetricCyclesTotal             = "tessera_admission_cycles_total"
	MetricCyclesSkippedTotal      = "tessera_admission_cycles_skipped_total"
	MetricStatusRefreshSeconds    = "tessera_queue_status_refresh_seconds"
	MetricStalePinsTotal          = "tessera_stale_pins_total"
	MetricIdlePods                = "tessera_controller_idle_pods"
	MetricIdleEvictionsTotal      = "tessera_controller_idle_evictions_total"
	evictionReasonReclaim         = "reclaim"
	resourceLabel, queueLabel     = "resource", "queue"
	reasonLabel                   = "reason"
	waitTimeBucketsStart, buckets = 1.0, 16 // 1 s to ~9 h
)

// Metrics are the controller's Prometheus metrics: cycle timings and
// totals, and per queue what Kueue's users look at (pending and admitted
// workloads, admission wait, usage against quota, limit and fair share,
// evictions) plus the memory its claims really use.
type Metrics struct {
	cycleDuration *prometheus.HistogramVec
	workloads     *prometheus.GaugeVec
	admitted      prometheus.Counter
	evicted       prometheus.Counter

	queuePending   *prometheus.GaugeVec
	queueAdmitted  *prometheus.CounterVec
	queueWait      *prometheus.HistogramVec
	queueUsage     *prometheus.GaugeVec
	queueQuota     *prometheus.GaugeVec
	queueLimit     *prometheus.GaugeVec
	queueFairShare *prometheus.GaugeVec
	queueEvicted   *prometheus.CounterVec
	queueUsed      *prometheus.GaugeVec
	// inadmissible counts the workloads the last cycle found inadmissible,
	// by fault. A gauge set afresh every cycle, not a counter: the same
	// workload is decided again every cycle until it is fixed or deleted,
	// so a counter would grow with the cycle rate, not with the workloads;
	// the gauge says how many are stuck now and why (alert on > 0 for a
	// while), and falls back to 0 once they are fixed.
	inadmissible *prometheus.GaugeVec
	// cycles counts the cycles run by trigger (the first relevant change
	// since the previous cycle), skippedCycles the wake-ups that ran no
	// cycle by why, stalePins the pods replaced for a stale pin.
	cycles        *prometheus.CounterVec
	skippedCycles *prometheus.CounterVec
	stalePins     *prometheus.CounterVec
	// statusRefresh times the queue status refreshes run instead of a
	// cycle when nothing is gated (its count is how many ran).
	statusRefreshes prometheus.Histogram
	// idle counts the pods the last idle pass found idle, by queue (every
	// queue with spec.idle, 0 included); idleEvictions the idle evictions
	// tried, by queue and result (evicted, refused).
	idle          *prometheus.GaugeVec
	idleEvictions *prometheus.CounterVec
	// now is the clock of the wait-time histogram (tests replace it).
	now func() time.Time
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	byQueue := []string{queueLabel}
	byResource := []string{queueLabel, resourceLabel}
	m := &Metrics{
		cycleDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricCycleSeconds,
			Help:    "Duration of admission (decision) cycles: decide (simulation included) and apply (API calls). Queue status refreshes with nothing gated are not cycles: " + MetricStatusRefreshSeconds + ".",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"phase"}),
		workloads: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricWorkloads,
			Help: "Workloads by state after the last cycle: pending, waiting, invalid.",
		}, []string{"state"}),
		admitted: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricAdmittedTotal, Help: "Workloads admitted."}),
		evicted:  prometheus.NewCounter(prometheus.CounterOpts{Name: MetricReclaimedTotal, Help: "Workloads evicted by reclaim."}),
		queuePending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricQueuePendingWorkloads, Help: "Workloads of the queue (and its descendants) waiting for admission after the last cycle.",
		}, byQueue),
		queueAdmitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricQueueAdmittedWorkloads, Help: "Workloads admitted to the leaf queue (a gang counts once).",
		}, byQueue),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricQueueAdmissionWait,
			Help:    "Time from a workload's creation (its admission gate is added then) to its admission (the gate removed), by leaf queue.",
			Buckets: prometheus.ExponentialBuckets(waitTimeBucketsStart, 2, buckets),
		}, byQueue),
		queueUsage: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricQueueResourceUsage, Help: "What admitted workloads of the queue and its descendants hold, by resource (gpu.tessera.dev/memory in bytes, gpu.tessera.dev/gpus).",
		}, byResource),
		queueQuota: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricQueueQuota, Help: "The queue's quota by resource (0 when unset).",
		}, byResource),
		queueLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricQueueLimit, Help: "The queue's limit by resource; absent when the queue has none.",
		}, byResource),
		queueFairShare: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricQueueFairShare, Help: "The queue's fair share of the cluster by resource.",
		}, byResource),
		queueEvicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricQueueEvictedWorkloads, Help: "Workloads of the leaf queue evicted, by reason (reclaim).",
		}, []string{queueLabel, reasonLabel}),
		queueUsed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricQueueMemoryUsedBytes, Help: "GPU memory the processes of the queue's admitted claims use (the kubelet plugins' samples in claim status); absent until one is sampled.",
		}, byQueue),
		inadmissible: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricInadmissibleWorkloads, Help: "Workloads the last admission cycle found inadmissible as they are (bad labels, claims the scheduler's allocator refuses, selectors that fail), by reason; the other workloads are decided regardless.",
		}, []string{reasonLabel}),
		cycles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricCyclesTotal, Help: "Admission cycles run, by trigger: the first change since the previous cycle that could admit a gated pod (pod, claim, queue, slice, class, node, namespace), stale-pin, resync, retry.",
		}, []string{"trigger"}),
		skippedCycles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricCyclesSkippedTotal, Help: "Wake-ups of the admission controller that ran no cycle, by reason: nothing-gated (a queue status refresh may have run), no-change.",
		}, []string{reasonLabel}),
		statusRefreshes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    MetricStatusRefreshSeconds,
			Help:    "Duration of queue status refreshes run instead of an admission cycle when no pod is gated: what runs is charged, nothing is decided or simulated (queue status writes included).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		stalePins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricStalePinsTotal, Help: "Pinned pods evicted because their pin went stale, by reason: node-gone, unschedulable.",
		}, []string{reasonLabel}),
		idle: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricIdlePods, Help: "Pods the last idle pass found idle under their queue's spec.idle (a gang's members only when all are idle), by queue; 0 for a queue with spec.idle and no idle pod.",
		}, byQueue),
		idleEvictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricIdleEvictionsTotal, Help: "Evictions of idle pods (spec.idle action Evict) through the Eviction API, by queue and result: evicted, refused (a PodDisruptionBudget or another error; tried again next pass).",
		}, []string{queueLabel, "result"}),
		now: time.Now,
	}
	if reg != nil {
		reg.MustRegister(m.cycleDuration, m.workloads, m.admitted, m.evicted,
			m.queuePending, m.queueAdmitted, m.queueWait, m.queueUsage, m.queueQuota, m.queueLimit, m.queueFairShare, m.queueEvicted, m.queueUsed, m.inadmissible,
			m.cycles, m.skippedCycles, m.stalePins, m.statusRefreshes, m.idle, m.idleEvictions)
	}
	return m
}

// MetricNames are every metric the controller exports.
func MetricNames() []string {
	return []string{MetricCycleSeconds, MetricWorkloads, MetricAdmittedTotal, MetricReclaimedTotal,
		MetricQueuePendingWorkloads, MetricQueueAdmittedWorkloads, MetricQueueAdmissionWait, MetricQueueResourceUsage,
		MetricQueueQuota, MetricQueueLimit, MetricQueueFairShare, MetricQueueEvictedWorkloads, MetricQueueMemoryUsedBytes,
		MetricInadmissibleWorkloads, MetricCyclesTotal, MetricCyclesSkippedTotal, MetricStatusRefreshSeconds, MetricStalePinsTotal,
		MetricIdlePods, MetricIdleEvictionsTotal}
}

func (m *Metrics) cycle(trigger string) {
	if m != nil {
		m.cycles.WithLabelValues(trigger).Inc()
	}
}

func (m *Metrics) skipped(reason string) {
	if m != nil {
		m.skippedCycles.WithLabelValues(reason).Inc()
	}
}

// idlePods sets the idle gauge to counts (queues not in it drop out).
func (m *Metrics) idlePods(counts map[string]int) {
	if m == nil {
		return
	}
	m.idle.Reset()
	for q, n := range counts {
		m.idle.WithLabelValues(q).Set(float64(n))
	}
}

func (m *Metrics) idleEviction(queue, result string) {
	if m != nil {
		m.idleEvictions.WithLabelValues(queue, result).Inc()
	}
}

func (m *Metrics) stalePin(reason string) {
	if m != nil {
		m.stalePins.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) observe(snap *decide.Snapshot, d *decide.Decision, apply time.Duration) {
	if m == nil {
		return
	}
	m.cycleDuration.WithLabelValues("decide").Observe(d.Stats.Duration.Seconds())
	m.cycleDuration.WithLabelValues("apply").Observe(apply.Seconds())
	m.workloads.WithLabelValues("pending").Set(float64(d.Stats.Pending - d.Stats.Admitted))
	m.workloads.WithLabelValues("waiting").Set(float64(d.Stats.Waiting))
	m.workloads.WithLabelValues("invalid").Set(float64(d.Stats.Invalid))
	m.admitted.Add(float64(d.Stats.Admitted))
	// Every reason is present (0 when none), so that rate and absence
	// queries need no special case.
	inadmissible := map[string]int{}
	for _, f := range decide.Faults {
		inadmissible[f] = 0
	}
	for _, v := range d.Waiting {
		if v.Invalid {
			f := v.Fault
			if f == "" {
				f = decide.FaultClaim
			}
			inadmissible[f]++
		}
	}
	for f, n := range inadmissible {
		m.inadmissible.WithLabelValues(f).Set(float64(n))
	}
	m.evicted.Add(float64(d.Stats.Evicted))

	now := m.now()
	for _, a := range d.Admit {
		q := a.Workload.QueueName
		m.queueAdmitted.WithLabelValues(q).Inc()
		created := now
		for _, p := range a.Pods {
			if t := p.CreationTimestamp.Time; !t.IsZero() && t.Before(created) {
				created = t
			}
		}
		m.queueWait.WithLabelValues(q).Observe(now.Sub(created).Seconds())
	}
	for _, e := range d.Evict {
		m.queueEvicted.WithLabelValues(e.Workload.QueueName, evictionReasonReclaim).Inc()
	}
	m.queues(snap, d.Queues)
}

// statusRefresh records a queue status refresh and sets the queue gauges
// from it.
func (m *Metrics) statusRefresh(snap *decide.Snapshot, st *decide.QueueStatuses) {
	if m == nil {
		return
	}
	m.statusRefreshes.Observe(st.Duration.Seconds())
	m.queues(snap, st.Queues)
}

// queues sets the per-queue gauges from statuses (by name) and the
// snapshot's queue specs.
func (m *Metrics) queues(snap *decide.Snapshot, statuses map[string]*v1alpha1.QueueStatus) {
	// Gauges are set afresh: a deleted queue disappears.
	for _, g := range []*prometheus.GaugeVec{m.queuePending, m.queueUsage, m.queueQuota, m.queueLimit, m.queueFairShare, m.queueUsed} {
		g.Reset()
	}
	for name, st := range statuses {
		m.queuePending.WithLabelValues(name).Set(float64(st.PendingWorkloads))
		setResources(m.queueUsage, name, st.Allocated)
		setResources(m.queueFairShare, name, st.FairShare)
		if used, ok := st.Used[v1alpha1.ResourceGPUMemory]; ok {
			m.queueUsed.WithLabelValues(name).Set(used.AsApproximateFloat64())
		}
	}
	for _, q := range snap.Queues {
		for r, spec := range q.Spec.Resources {
			quota := 0.0
			if spec.Quota != nil {
				quota = spec.Quota.AsApproximateFloat64()
			}
			m.queueQuota.WithLabelValues(q.Name, string(r)).Set(quota)
			if spec.Limit != nil {
				m.queueLimit.WithLabelValues(q.Name, string(r)).Set(spec.Limit.AsApproximateFloat64())
			}
		}
	}
}

func setResources(g *prometheus.GaugeVec, q string, l v1alpha1.ResourceList) {
	for r, v := range l {
		g.WithLabelValues(q, string(r)).Set(v.AsApproximateFloat64())
	}
}
