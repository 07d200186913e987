package controller

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
)

func TestQueueMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	m.now = func() time.Time { return now }
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	snap := &decide.Snapshot{Queues: []*v1alpha1.Queue{
		{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}, Spec: v1alpha1.QueueSpec{Resources: map[v1alpha1.ResourceName]v1alpha1.QueueResource{
			v1alpha1.ResourceGPUMemory: {Quota: q("12Gi"), Limit: q("16Gi")},
		}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "gone"}},
	}}
	pod := func(created time.Time) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(created)}}
	}
	d := &decide.Decision{
		Admit: []*decide.Admission{{Workload: &decide.Workload{QueueName: "team-a"}, Pods: []*corev1.Pod{pod(now.Add(-90 * time.Second)), pod(now.Add(-30 * time.Second))}}},
		Evict: []*decide.Eviction{{Workload: &decide.Workload{QueueName: "team-b"}}},
		Queues: map[string]*v1alpha1.QueueStatus{
			"team-a": {PendingWorkloads: 2, Allocated: v1alpha1.ResourceList{v1alpha1.ResourceGPUMemory: resource.MustParse("8Gi")},
				Used: v1alpha1.ResourceList{v1alpha1.ResourceGPUMemory: resource.MustParse("2Gi")}},
			"gone": {PendingWorkloads: 1},
		},
	}
	m.observe(snap, d, time.Millisecond)
	// The next cycle no longer has the queue "gone".
	delete(d.Queues, "gone")
	snap.Queues = snap.Queues[:1]
	d.Admit, d.Evict = nil, nil
	m.observe(snap, d, time.Millisecond)

	want := `
# HELP tessera_queue_pending_workloads Workloads of the queue (and its descendants) waiting for admission after the last cycle.
# TYPE tessera_queue_pending_workloads gauge
tessera_queue_pending_workloads{queue="team-a"} 2
# HELP tessera_queue_admitted_workloads_total Workloads admitted to the leaf queue (a gang counts once).
# TYPE tessera_queue_admitted_workloads_total counter
tessera_queue_admitted_workloads_total{queue="team-a"} 1
# HELP tessera_queue_resource_usage What admitted workloads of the queue and its descendants hold, by resource (gpu.tessera.dev/memory in bytes, gpu.tessera.dev/gpus).
# TYPE tessera_queue_resource_usage gauge
tessera_queue_resource_usage{queue="team-a",resource="gpu.tessera.dev/memory"} 8.589934592e+09
# HELP tessera_queue_quota The queue's quota by resource (0 when unset).
# TYPE tessera_queue_quota gauge
tessera_queue_quota{queue="team-a",resource="gpu.tessera.dev/memory"} 1.2884901888e+10
# HELP tessera_queue_limit The queue's limit by resource; absent when the queue has none.
# TYPE tessera_queue_limit gauge
tessera_queue_limit{queue="team-a",resource="gpu.tessera.dev/memory"} 1.7179869184e+10
# HELP tessera_queue_evicted_workloads_total Workloads of the leaf queue evicted, by reason (reclaim).
# TYPE tessera_queue_evicted_workloads_total counter
tessera_queue_evicted_workloads_total{queue="team-b",reason="reclaim"} 1
# HELP tessera_queue_memory_used_bytes GPU memory the processes of the queue's admitted claims use (the kubelet plugins' samples in claim status); absent until one is sampled.
# TYPE tessera_queue_memory_used_bytes gauge
tessera_queue_memory_used_bytes{queue="team-a"} 2.147483648e+09
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), MetricQueuePendingWorkloads, MetricQueueAdmittedWorkloads, MetricQueueResourceUsage,
		MetricQueueQuota, MetricQueueLimit, MetricQueueEvictedWorkloads, MetricQueueMemoryUsedBytes); err != nil {
		t.Error(err)
	}
	// The wait is from the gang's first member's creation: 90 s.
	if got := testutil.CollectAndCount(m.queueWait); got != 1 {
		t.Fatalf("%d wait-time series, want 1", got)
	}
	families, _ := reg.Gather()
	for _, f := range families {
		if f.GetName() == MetricQueueAdmissionWait {
			h := f.GetMetric()[0].GetHistogram()
			if h.GetSampleCount() != 1 || h.GetSampleSum() != 90 {
				t.Errorf("wait time: %d samples, sum %v; want 1 of 90 s", h.GetSampleCount(), h.GetSampleSum())
			}
		}
	}
	// Every metric the controller registers is in MetricNames.
	names := map[string]bool{}
	for _, n := range MetricNames() {
		names[n] = true
	}
	for _, f := range families {
		if !names[f.GetName()] {
			t.Errorf("metric %s is not listed in MetricNames", f.GetName())
		}
	}
}
