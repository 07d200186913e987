package top

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

const driver = "gpu.tessera.dev"

// claim builds an allocated claim on node with one Tessera device of
// limit bytes, used bytes when used >= 0 (else not sampled yet).
func claim(ns, name, node, pod string, limit uint64, used int64) resourceapi.ResourceClaim {
	st := v1alpha1.DeviceStatus{UUID: "GPU-1", MemoryLimitBytes: limit}
	if used >= 0 {
		st.Usage = &v1alpha1.DeviceUsage{MemoryUsedBytes: uint64(used), SMUtilizationPercent: 10, Processes: 1}
	}
	raw, _ := json.Marshal(st)
	return resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Status: resourceapi.ResourceClaimStatus{
			Allocation:  &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{Driver: driver, Pool: node, Device: "gpu-0"}}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod}},
			Devices:     []resourceapi.AllocatedDeviceStatus{{Driver: driver, Pool: node, Device: "gpu-0", Data: &runtime.RawExtension{Raw: raw}}},
		},
	}
}

const gi = 1 << 30

func TestTop(t *testing.T) {
	claims := []resourceapi.ResourceClaim{
		claim("ml", "idle", "node-1", "p-idle", 8*gi, gi),   // 7Gi wasted
		claim("ml", "busy", "node-1", "p-busy", 4*gi, 4*gi), // none
		claim("web", "half", "node-2", "p-half", 4*gi, 2*gi),
		claim("web", "new", "node-2", "p-new", 16*gi, -1), // not sampled: unknown, not waste
		{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "nic"}, Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{Driver: "nic.example.com", Pool: "node-2", Device: "eth0"}}}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "pending"}},
	}
	pods := map[string]*corev1.Pod{
		"ml/p-idle":  {ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1alpha1.QueueLabel: "research"}}},
		"ml/p-busy":  {ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1alpha1.QueueLabel: "research"}}},
		"web/p-half": {ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1alpha1.QueueLabel: "serving"}}},
	}
	rows := Claims(claims, pods, driver)
	for _, tc := range []struct {
		by, sort string
		want     []string // first column of each row, in order
		contains []string
	}{
		{by: ByClaim, sort: SortWaste, want: []string{"ml idle", "web half", "ml busy", "web new"}, contains: []string{"ml  ", "8Gi", "1Gi", "12%", "7Gi", "p-idle", "research"}},
		{by: ByClaim, sort: SortUsed, want: []string{"ml busy", "web half", "ml idle", "web new"}},
		{by: ByClaim, sort: SortAllocated, want: []string{"ml idle", "ml busy", "web half", "web new"}},
		{by: ByNamespace, sort: SortWaste, want: []string{"ml", "web"}},
		{by: ByQueue, sort: SortWaste, want: []string{"research", "serving", "-"}},
		{by: ByNode, sort: SortWaste, want: []string{"node-1", "node-2"}, contains: []string{"node-2  2", "20Gi", "2Gi", "50%"}},
	} {
		t.Run(tc.by+"/"+tc.sort, func(t *testing.T) {
			grouped, err := Group(append([]Row(nil), rows...), tc.by)
			if err != nil {
				t.Fatal(err)
			}
			if err := Sort(grouped, tc.sort); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := Print(&buf, grouped, tc.by); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")[1:]
			if len(lines) != len(tc.want) {
				t.Fatalf("%d rows, want %d:\n%s", len(lines), len(tc.want), buf.String())
			}
			for i, w := range tc.want {
				f := strings.Fields(lines[i])
				got := f[0]
				if tc.by == ByClaim {
					got = f[0] + " " + f[1]
				}
				if got != w {
					t.Errorf("row %d is %q, want %q\n%s", i, got, w, buf.String())
				}
			}
			for _, c := range tc.contains {
				if !strings.Contains(buf.String(), c) {
					t.Errorf("output lacks %q:\n%s", c, buf.String())
				}
			}
		})
	}
	if _, err := Group(rows, "pod"); err == nil || !strings.Contains(err.Error(), "--by") {
		t.Errorf("bad --by: %v", err)
	}
	if err := Sort(rows, "size"); err == nil || !strings.Contains(err.Error(), "--sort") {
		t.Errorf("bad --sort: %v", err)
	}
}

// A translated pod's claim says what the pod was written for; the column
// appears only when some claim was translated.
func TestTopFrom(t *testing.T) {
	claims := []resourceapi.ResourceClaim{
		claim("ml", "native", "node-1", "p-native", 4*gi, gi),
		claim("ml", "migrated", "node-1", "p-kai", 8*gi, gi),
	}
	pods := map[string]*corev1.Pod{
		"ml/p-native": {ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1alpha1.QueueLabel: "research"}}},
		"ml/p-kai": {ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1alpha1.QueueLabel: "research"},
			Annotations: map[string]string{v1alpha1.TranslatedAnnotation: "from kai; container main: gpu-fraction=0.5 -> 1 share of gpu.tessera.dev (memory 7552Mi, compute uncapped)"}}},
	}
	var buf bytes.Buffer
	if err := Print(&buf, Claims(claims, pods, driver), ByClaim); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if !strings.Contains(lines[0], "FROM") || strings.Fields(lines[1])[5] != "-" || strings.Fields(lines[2])[5] != "kai" {
		t.Errorf("output:\n%s", buf.String())
	}
	buf.Reset()
	if err := Print(&buf, Claims(claims[:1], pods, driver), ByClaim); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "FROM") {
		t.Errorf("no translated claim, yet a FROM column:\n%s", buf.String())
	}
}
