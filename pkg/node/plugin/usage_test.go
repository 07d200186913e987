package plugin

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
	"github.com/tessera-dev/tessera/pkg/node/procusage"
	"github.com/tessera-dev/tessera/test/testutil"
)

// metricValue returns the value of the sample of a metric family whose
// labels include want.
func metricValue(t *testing.T, m *metrics, name string, want map[string]string) (float64, bool) {
	t.Helper()
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	samples:
		for _, s := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range s.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue samples
				}
			}
			switch f.GetType() {
			case dto.MetricType_GAUGE:
				return s.GetGauge().GetValue(), true
			case dto.MetricType_COUNTER:
				return s.GetCounter().GetValue(), true
			case dto.MetricType_HISTOGRAM:
				return float64(s.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

func writeCgroup(t *testing.T, root string, pid int, podUID string) {
	t.Helper()
	dir := filepath.Join(root, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	content := "0::/system.slice/host.service\n"
	if podUID != "" {
		content = fmt.Sprintf("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod%s.slice/cri-containerd-%064x.scope\n", podUID, pid)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestUsageMetricsAndStatus: the compute processes of a claim's pods on
// its device are summed per claim, exported next to the allocation, and
// written into the claim's status only when they change noticeably; a
// process outside any claim counts for its GPU only; an unprepared claim
// leaves the metrics.
func TestUsageMetricsAndStatus(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := tempDir(t)
	opts := nodeOptions(dir, "t4:2", false, nil)
	opts.MetricsBindAddress = "127.0.0.1:0"
	procRoot := filepath.Join(dir, "proc")
	opts.HostProcRoot = procRoot
	const podA, podB, podC = "aaaaaaaa-1111-2222-3333-444444444444", "bbbbbbbb-1111-2222-3333-444444444444", "cccccccc-1111-2222-3333-444444444444"
	withPod := func(c *resourceapi.ResourceClaim, uid string) *resourceapi.ResourceClaim {
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-" + c.Name, UID: types.UID(uid)}}
		return c
	}
	a := withPod(newClaim("a", shareResult("gpu", "gpu-0", "s-a", 4*gib, 0)), podA)
	b := withPod(newClaim("b", shareResult("gpu", "gpu-0", "s-b", 2*gib, 50)), podB)
	c := withPod(newClaim("c", deviceResult("gpu", "gpu-1")), podC)
	h := startHarness(t, ctx, opts, a, b, c)
	if resp, err := h.prepare(a, b, c); err != nil {
		t.Fatal(err)
	} else {
		for uid, r := range resp.Claims {
			if r.GetError() != "" {
				t.Fatalf("%s: %s", uid, r.GetError())
			}
		}
	}
	d := h.driver
	gpu0 := d.backend.Mock.Devices()[0].UUID
	writeCgroup(t, procRoot, 100, podA)
	writeCgroup(t, procRoot, 101, podA)
	writeCgroup(t, procRoot, 200, podB)
	writeCgroup(t, procRoot, 300, "") // a host process
	d.backend.Mock.SetProcesses(gpu0, []nvmlmock.Process{
		{PID: 100, UsedMemory: 768 << 20, SMUtil: 20}, {PID: 101, UsedMemory: 256 << 20, SMUtil: 10},
		{PID: 200, UsedMemory: 256 << 20, SMUtil: 5}, {PID: 300, UsedMemory: 512 << 20},
	})
	sampler := procusage.NewSampler(d.backend, procRoot)
	d.sampleUsage(ctx, sampler)

	claimLabels := func(name, device string) map[string]string {
		return map[string]string{"namespace": "default", "claim": name, "pod": "pod-" + name, "device": device, "node": testNode}
	}
	for _, tc := range []struct {
		metric string
		labels map[string]string
		want   float64
	}{
		{MetricClaimMemoryAllocated, claimLabels("a", "gpu-0"), float64(4 * gib)},
		{MetricClaimMemoryUsed, claimLabels("a", "gpu-0"), 1 << 30},
		{MetricClaimSMUtilization, claimLabels("a", "gpu-0"), 30},
		// No cores requested: the compute default (uncapped) leaves it
		// the whole GPU's compute.
		{MetricClaimComputeAllocated, claimLabels("a", "gpu-0"), 100},
		{MetricClaimMemoryUsed, claimLabels("b", "gpu-0"), 256 << 20},
		{MetricClaimComputeAllocated, claimLabels("b", "gpu-0"), 50},
		{MetricClaimMemoryUsed, claimLabels("c", "gpu-1"), 0},
		{MetricGPUMemoryAllocated, map[string]string{"device": "gpu-0"}, float64(6 * gib)},
		{MetricGPUMemoryUsed, map[string]string{"device": "gpu-0"}, float64(1<<30 + 768<<20)},
		{metricUnattributedMemoryUsed, map[string]string{"device": "gpu-0"}, 512 << 20},
		{MetricGPUProcesses, map[string]string{"device": "gpu-0"}, 4}, // three in claims, one host process
		{MetricGPUProcesses, map[string]string{"device": "gpu-1"}, 0},
		{MetricGPUHealthy, map[string]string{"device": "gpu-1", "uuid": d.backend.Mock.Devices()[1].UUID}, 1},
		{MetricPreparedClaims, nil, 3},
		{MetricPrepareDuration, map[string]string{"kind": kindShare}, 2},
		{MetricPrepareDuration, map[string]string{"kind": kindGPU}, 1},
	} {
		got, ok := metricValue(t, d.metrics, tc.metric, tc.labels)
		if !ok || got != tc.want {
			t.Errorf("%s%v = %v (present %v), want %v", tc.metric, tc.labels, got, ok, tc.want)
		}
	}

	statusUsage := func() *v1alpha1.DeviceUsage {
		cl, err := h.client.ResourceV1().ResourceClaims("default").Get(ctx, "a", metav1.GetOptions{})
		if err != nil || len(cl.Status.Devices) != 1 || cl.Status.Devices[0].Data == nil {
			return nil
		}
		var ds v1alpha1.DeviceStatus
		if err := json.Unmarshal(cl.Status.Devices[0].Data.Raw, &ds); err != nil {
			t.Fatal(err)
		}
		return ds.Usage
	}
	testutil.EventuallyTrue(t, 10*time.Second, "claim a's status shows 1 GiB used by 2 processes", func() bool {
		u := statusUsage()
		return u != nil && u.MemoryUsedBytes == 1<<30 && u.Processes == 2 && u.SMUtilizationPercent == 30
	})
	writes := func() int {
		n := 0
		for _, a := range h.client.Actions() {
			if a.GetVerb() == "update" && a.GetSubresource() == "status" {
				n++
			}
		}
		return n
	}
	// A small change (under max(64 MiB, 5% of 4 GiB) = 204.8 MiB) is not
	// written; a larger one is.
	before := writes()
	d.backend.Mock.SetProcesses(gpu0, []nvmlmock.Process{{PID: 100, UsedMemory: 868 << 20, SMUtil: 20}, {PID: 101, UsedMemory: 256 << 20, SMUtil: 10}, {PID: 200, UsedMemory: 256 << 20, SMUtil: 5}})
	d.sampleUsage(ctx, sampler)
	time.Sleep(200 * time.Millisecond)
	if got := writes(); got != before {
		t.Errorf("a 100 MiB change wrote the status %d times", got-before)
	}
	d.backend.Mock.SetProcesses(gpu0, []nvmlmock.Process{{PID: 100, UsedMemory: 3 << 30, SMUtil: 20}, {PID: 101, UsedMemory: 256 << 20, SMUtil: 10}, {PID: 200, UsedMemory: 256 << 20, SMUtil: 5}})
	d.sampleUsage(ctx, sampler)
	testutil.EventuallyTrue(t, 10*time.Second, "claim a's status shows 3.25 GiB used", func() bool {
		u := statusUsage()
		return u != nil && u.MemoryUsedBytes == 3<<30+256<<20
	})

	if _, err := h.unprepare(b); err != nil {
		t.Fatal(err)
	}
	if _, ok := metricValue(t, d.metrics, MetricClaimMemoryAllocated, claimLabels("b", "gpu-0")); ok {
		t.Error("an unprepared claim is still exported")
	}
}
