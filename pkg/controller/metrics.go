package controller

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tessera-dev/tessera/pkg/admission"
)

// Metrics are the controller's Prometheus metrics.
type Metrics struct {
	cycleDuration *prometheus.HistogramVec
	workloads     *prometheus.GaugeVec
	admitted      prometheus.Counter
	evicted       prometheus.Counter
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		cycleDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tessera_admission_cycle_seconds",
			Help:    "Duration of admission cycles: decide (simulation included) and apply (API calls).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"phase"}),
		workloads: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tessera_admission_workloads",
			Help: "Workloads by state after the last cycle: pending, waiting, invalid.",
		}, []string{"state"}),
		admitted: prometheus.NewCounter(prometheus.CounterOpts{Name: "tessera_admitted_workloads_total", Help: "Workloads admitted."}),
		evicted:  prometheus.NewCounter(prometheus.CounterOpts{Name: "tessera_reclaimed_workloads_total", Help: "Workloads evicted by reclaim."}),
	}
	if reg != nil {
		reg.MustRegister(m.cycleDuration, m.workloads, m.admitted, m.evicted)
	}
	return m
}

func (m *Metrics) observe(d *admission.Decision, apply time.Duration) {
	if m == nil {
		return
	}
	m.cycleDuration.WithLabelValues("decide").Observe(d.Stats.Duration.Seconds())
	m.cycleDuration.WithLabelValues("apply").Observe(apply.Seconds())
	m.workloads.WithLabelValues("pending").Set(float64(d.Stats.Pending - d.Stats.Admitted))
	m.workloads.WithLabelValues("waiting").Set(float64(d.Stats.Waiting))
	m.workloads.WithLabelValues("invalid").Set(float64(d.Stats.Invalid))
	m.admitted.Add(float64(d.Stats.Admitted))
	m.evicted.Add(float64(d.Stats.Evicted))
}
