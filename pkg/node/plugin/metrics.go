package plugin

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/node/prepare"
)

// Metric names the plugin exports (docs/observability.md; the Grafana
// dashboard's test checks its queries against MetricNames).
const (
	MetricClaimMemoryAllocated   = "tessera_claim_memory_allocated_bytes"
	MetricClaimMemoryUsed        = "tessera_claim_memory_used_bytes"
	MetricClaimComputeAllocated  = "tessera_claim_compute_allocated_percent"
	MetricClaimSMUtilization     = "tessera_claim_sm_utilization_percent"
	MetricGPUMemoryTotal         = "tessera_gpu_memory_total_bytes"
	MetricGPUMemoryAllocated     = "tessera_gpu_memory_allocated_bytes"
	MetricGPUMemoryUsed          = "tessera_gpu_memory_used_bytes"
	MetricGPUHealthy             = "tessera_gpu_healthy"
	MetricGPUProcesses           = "tessera_gpu_processes"
	MetricPrepareDuration        = "tessera_prepare_duration_seconds"
	MetricPrepareErrors          = "tessera_prepare_errors_total"
	MetricPreparedClaims         = "tessera_prepared_claims"
	MetricUsageSampleDuration    = "tessera_usage_sample_duration_seconds"
	metricUnattributedMemoryUsed = "tessera_gpu_unattributed_memory_used_bytes"
)

// MetricNames are every metric the plugin exports.
func MetricNames() []string {
	return []string{
		MetricClaimMemoryAllocated, MetricClaimMemoryUsed, MetricClaimComputeAllocated, MetricClaimSMUtilization,
		MetricGPUMemoryTotal, MetricGPUMemoryAllocated, MetricGPUMemoryUsed, MetricGPUHealthy, MetricGPUProcesses,
		MetricPrepareDuration, MetricPrepareErrors, MetricPreparedClaims, MetricUsageSampleDuration, metricUnattributedMemoryUsed,
	}
}

// Claim kinds of tessera_prepare_duration_seconds.
const (
	kindShare     = "share"
	kindGPU       = "gpu"
	kindTimeSlice = "timeslice"
	kindMIG       = "mig"
)

// metrics are the plugin's Prometheus metrics: prepare latency and errors
// as they happen, per-claim and per-GPU gauges from the records and the
// last usage sample when scraped.
type metrics struct {
	registry        *prometheus.Registry
	prepareDuration *prometheus.HistogramVec
	prepareErrors   *prometheus.CounterVec
	sampleDuration  prometheus.Histogram
}

func newMetrics(d *Driver) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		prepareDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricPrepareDuration,
			Help:    "Time to prepare one claim (NodePrepareResources), by kind: share, gpu, timeslice, mig.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"kind"}),
		prepareErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricPrepareErrors,
			Help: "Claims that failed to prepare, by reason: conflict, mig, enforcement, config, other.",
		}, []string{"reason"}),
		sampleDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    MetricUsageSampleDuration,
			Help:    "Time of one usage sampling pass over every GPU (NVML and /proc).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 12),
		}),
	}
	m.registry.MustRegister(m.prepareDuration, m.prepareErrors, m.sampleDuration, &usageCollector{d: d},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// claimKind is the kind of a claim's devices of this driver, for the
// prepare histogram (the most specific wins).
func claimKind(claim *resourceapi.ResourceClaim) string {
	kind := ""
	if claim.Status.Allocation == nil {
		return kindGPU
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != devicemodel.DriverName {
			continue
		}
		name, err := devicemodel.ParseName(r.Device)
		switch {
		case err != nil:
		case name.Type == devicemodel.TypeMIG:
			return kindMIG
		case name.Type == devicemodel.TypeTimeSlice:
			kind = kindTimeSlice
		case r.ShareID != nil && kind == "":
			kind = kindShare
		}
	}
	if kind == "" {
		return kindGPU
	}
	return kind
}

func (m *metrics) observePrepare(claim *resourceapi.ResourceClaim, took time.Duration, err error) {
	if m == nil {
		return
	}
	m.prepareDuration.WithLabelValues(claimKind(claim)).Observe(took.Seconds())
	if err != nil {
		m.prepareErrors.WithLabelValues(string(prepare.ReasonOf(err))).Inc()
	}
}

// serve serves /metrics on addr until ctx ends. When the address is taken
// (during a seamless upgrade the old plugin pod holds the host port until
// the new one is ready) it keeps trying in the background: metrics must
// never keep the plugin from serving the kubelet.
func (m *metrics) serve(ctx context.Context, addr string) {
	logger := klog.FromContext(ctx)
	go func() {
		for {
			ln, err := net.Listen("tcp", addr)
			if err == nil {
				m.serveOn(ctx, ln)
				return
			}
			logger.Info("Metrics address not available yet; retrying", "address", addr, "error", err.Error())
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Second):
			}
		}
	}()
}

func (m *metrics) serveOn(ctx context.Context, ln net.Listener) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{Registry: m.registry}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Metrics server stopped")
		}
	}()
	klog.FromContext(ctx).Info("Serving metrics", "address", ln.Addr().String())
}

// usageCollector exports the per-claim and per-GPU gauges, computed when
// scraped from the prepared claims and the last usage sample, so that a
// claim that is unprepared disappears at once.
type usageCollector struct{ d *Driver }

var (
	claimLabels = []string{"namespace", "claim", "pod", "device", "node"}
	gpuLabels   = []string{"node", "device", "uuid"}
	descs       = map[string]*prometheus.Desc{
		MetricClaimMemoryAllocated:   prometheus.NewDesc(MetricClaimMemoryAllocated, "GPU memory allocated to the claim on the device (its share, MIG instance or whole GPU), bytes.", claimLabels, nil),
		MetricClaimMemoryUsed:        prometheus.NewDesc(MetricClaimMemoryUsed, "GPU memory the claim's processes hold on the device at the last sample (NVML), bytes; absent until sampled.", claimLabels, nil),
		MetricClaimComputeAllocated:  prometheus.NewDesc(MetricClaimComputeAllocated, "Compute share allocated to the claim on the device, percent (100: no cap).", claimLabels, nil),
		MetricClaimSMUtilization:     prometheus.NewDesc(MetricClaimSMUtilization, "SM utilization of the claim's processes on the device over the last sampling interval, percent of the device; absent until sampled.", claimLabels, nil),
		MetricGPUMemoryTotal:         prometheus.NewDesc(MetricGPUMemoryTotal, "GPU memory of the GPU (NVML), bytes.", gpuLabels, nil),
		MetricGPUMemoryAllocated:     prometheus.NewDesc(MetricGPUMemoryAllocated, "GPU memory allocated to prepared claims on the GPU, bytes.", gpuLabels, nil),
		MetricGPUMemoryUsed:          prometheus.NewDesc(MetricGPUMemoryUsed, "GPU memory in use on the GPU at the last sample (NVML, all processes and the driver), bytes.", gpuLabels, nil),
		MetricGPUHealthy:             prometheus.NewDesc(MetricGPUHealthy, "1 when the GPU is healthy, 0 while it has a fatal fault (a NoSchedule or NoExecute health taint).", gpuLabels, nil),
		MetricGPUProcesses:           prometheus.NewDesc(MetricGPUProcesses, "Compute processes on the GPU (its MIG devices included; every process, in a claim or not) at the last sample (NVML); absent until sampled.", gpuLabels, nil),
		MetricPreparedClaims:         prometheus.NewDesc(MetricPreparedClaims, "Claims prepared on the node.", nil, nil),
		metricUnattributedMemoryUsed: prometheus.NewDesc(metricUnattributedMemoryUsed, "GPU memory held by compute processes that belong to no prepared claim (other pods, host processes), bytes.", gpuLabels, nil),
	}
)

func (c *usageCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
}

func (c *usageCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.d.usageSnapshot()
	node := c.d.opts.NodeName
	gauge := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(descs[name], prometheus.GaugeValue, v, labels...)
	}
	gauge(MetricPreparedClaims, float64(len(snap.claims)))
	for _, cu := range snap.claims {
		labels := []string{cu.namespace, cu.claim, cu.pod, cu.device, node}
		gauge(MetricClaimMemoryAllocated, float64(cu.allocated), labels...)
		gauge(MetricClaimComputeAllocated, float64(cu.compute), labels...)
		if cu.usage != nil {
			gauge(MetricClaimMemoryUsed, float64(cu.usage.MemoryUsedBytes), labels...)
			gauge(MetricClaimSMUtilization, float64(cu.usage.SMUtilizationPercent), labels...)
		}
	}
	for _, g := range snap.gpus {
		labels := []string{node, g.device, g.uuid}
		gauge(MetricGPUMemoryTotal, float64(g.total), labels...)
		gauge(MetricGPUMemoryAllocated, float64(g.allocated), labels...)
		healthy := 0.0
		if g.healthy {
			healthy = 1
		}
		gauge(MetricGPUHealthy, healthy, labels...)
		if g.sampled {
			gauge(MetricGPUMemoryUsed, float64(g.used), labels...)
			gauge(metricUnattributedMemoryUsed, float64(g.unattributed), labels...)
			gauge(MetricGPUProcesses, float64(g.processes), labels...)
		}
	}
}
