package idle

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

const driver = "gpu.tessera.dev"

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }

func TestParsePercent(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
		err  bool
	}{
		{"5%", 0.05, false}, {"0%", 0, false}, {"100%", 1, false}, {"0.5%", 0.005, false},
		{"5", 0, true}, {"101%", 0, true}, {"-1%", 0, true}, {"x%", 0, true}, {"NaN%", 0, true},
	} {
		got, err := ParsePercent(tc.in)
		if (err != nil) != tc.err || (!tc.err && math.Abs(got-tc.want) > 1e-12) {
			t.Errorf("ParsePercent(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestPolicyOf(t *testing.T) {
	q := &v1alpha1.Queue{}
	if p, err := PolicyOf(q); p != nil || err != nil {
		t.Fatalf("no spec.idle: %v, %v; want nil, nil", p, err)
	}
	q.Spec.Idle = &v1alpha1.IdlePolicy{After: metav1.Duration{Duration: 2 * time.Hour}, UsedBelow: "5%"}
	p, err := PolicyOf(q)
	if err != nil || p.After != 2*time.Hour || p.UsedBelow != 0.05 || p.Action != v1alpha1.IdleReport {
		t.Fatalf("got %+v, %v; want 2h, 0.05, Report", p, err)
	}
	q.Spec.Idle.After.Duration = time.Second
	if _, err := PolicyOf(q); err == nil {
		t.Error("after 1s accepted")
	}
}

// sample is one status write of the plugin: (minute, fraction).
type sample struct {
	m int
	f float64
}

func TestBelowSince(t *testing.T) {
	inf := math.Inf(1)
	for _, tc := range []struct {
		name    string
		samples []sample
		u       float64
		since   int // minute; -1: not below
	}{
		{"none", nil, 0.05, -1},
		{"one idle sample covers from its time", []sample{{0, 0}}, 0.05, 0},
		{"busy now", []sample{{0, 0}, {10, 0.5}}, 0.05, -1},
		{"busy then idle: from the first idle sample", []sample{{0, 0.5}, {10, 0.01}}, 0.05, 10},
		{"idle, busy, idle, idle", []sample{{0, 0}, {5, 0.2}, {7, 0.01}, {9, 0.02}}, 0.05, 7},
		{"a larger threshold looks past the spike", []sample{{0, 0}, {5, 0.2}, {7, 0.01}, {9, 0.02}}, 0.5, 0},
		{"at the threshold is not below", []sample{{0, 0.05}, {3, 0}}, 0.05, 3},
		{"unmeasured breaks the run", []sample{{0, 0}, {4, inf}, {8, 0}}, 0.05, 8},
		{"unmeasured now", []sample{{0, 0}, {4, inf}}, 1, -1},
		{"stale and repeated samples are ignored", []sample{{0, 0}, {6, 0.3}, {6, 0}, {2, 0}, {9, 0}}, 0.05, 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHistory()
			for _, s := range tc.samples {
				h.Observe("c", at(s.m), s.f)
			}
			since, _, ok := h.BelowSince("c", tc.u)
			if tc.since < 0 {
				if ok {
					t.Fatalf("below since %v; want not below", since)
				}
				return
			}
			if !ok || !since.Equal(at(tc.since)) {
				t.Fatalf("below since %v (%v); want minute %d", since, ok, tc.since)
			}
		})
	}
}

func TestHistoryBounded(t *testing.T) {
	h := NewHistory()
	// Falling usage keeps every sample (each is a suffix maximum).
	for i := range 2 * maxRecords {
		h.Observe("c", at(i), 1-float64(i)/float64(4*maxRecords))
	}
	if n := len(h.claims["c"].records); n != maxRecords {
		t.Fatalf("%d records; want %d", n, maxRecords)
	}
	// Dropping the oldest moves the coverage start later, never earlier.
	if since, _, ok := h.BelowSince("c", 2); !ok || !since.Equal(at(maxRecords)) {
		t.Fatalf("below 200%% since %v; want minute %d", since, maxRecords)
	}
}

func claim(uid string, devices ...v1alpha1.DeviceStatus) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid)}}
	for _, d := range devices {
		raw, _ := json.Marshal(d)
		c.Status.Devices = append(c.Status.Devices, resourceapi.AllocatedDeviceStatus{Driver: driver, Device: "gpu-0", Data: &runtime.RawExtension{Raw: raw}})
	}
	return c
}

func dev(limit, used uint64, procs, sm int, m int) v1alpha1.DeviceStatus {
	return v1alpha1.DeviceStatus{MemoryLimitBytes: limit, ComputeLimit: 100,
		Usage: &v1alpha1.DeviceUsage{MemoryUsedBytes: used, Processes: procs, SMUtilizationPercent: sm, SampledAt: metav1.NewTime(at(m))}}
}

func TestClaimSample(t *testing.T) {
	const gi = 1 << 30
	mig := dev(gi, 0, 0, 0, 1)
	mig.MIGProfile = "1g.10gb"
	noUsage := dev(gi, 0, 0, 0, 0)
	noUsage.Usage = nil
	inf := math.Inf(1)
	for _, tc := range []struct {
		name          string
		claim         *resourceapi.ResourceClaim
		f             float64
		ours, sampled bool
		m             int
	}{
		{"not ours", &resourceapi.ResourceClaim{}, 0, false, false, 0},
		{"no usage yet", claim("a", noUsage), 0, true, false, 0},
		{"one of two devices without usage", claim("a", dev(gi, 0, 0, 0, 1), noUsage), 0, true, false, 0},
		{"idle", claim("a", dev(gi, 0, 0, 0, 3)), 0, true, true, 3},
		{"memory", claim("a", dev(gi, gi/4, 1, 0, 3)), 0.25, true, true, 3},
		{"SM counts", claim("a", dev(gi, gi/100, 1, 30, 3)), 0.3, true, true, 3},
		{"largest device, latest time", claim("a", dev(gi, gi/2, 1, 0, 3), dev(gi, 0, 0, 0, 5)), 0.5, true, true, 5},
		{"MIG is unmeasured", claim("a", mig), inf, true, true, 1},
		{"processes without memory are unmeasured", claim("a", dev(gi, 0, 2, 0, 1)), inf, true, true, 1},
		{"no memory limit is unmeasured", claim("a", dev(0, 0, 0, 0, 1)), inf, true, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts, f, ours, sampled := ClaimSample(tc.claim, driver)
			if ours != tc.ours || sampled != tc.sampled || f != tc.f || (sampled && !ts.Equal(at(tc.m))) {
				t.Fatalf("got %v %v ours=%v sampled=%v; want %v minute %d ours=%v sampled=%v", ts, f, ours, sampled, tc.f, tc.m, tc.ours, tc.sampled)
			}
		})
	}
}

func TestJudge(t *testing.T) {
	p := &Policy{After: 60 * time.Minute, UsedBelow: 0.05, Action: v1alpha1.IdleEvict}
	h := NewHistory()
	h.Observe("idle", at(0), 0.01)
	h.Observe("idle-late", at(30), 0)
	h.Observe("busy", at(0), 0)
	h.Observe("busy", at(50), 0.4)
	for _, tc := range []struct {
		name   string
		now    int
		claims []types.UID
		idle   bool
	}{
		{"no claims", 100, nil, false},
		{"no samples", 100, []types.UID{"unknown"}, false},
		{"before the window", 59, []types.UID{"idle"}, false},
		{"at the window", 60, []types.UID{"idle"}, true},
		{"every claim must be covered", 60, []types.UID{"idle", "idle-late"}, false},
		{"both covered later", 90, []types.UID{"idle", "idle-late"}, true},
		{"busy", 200, []types.UID{"busy"}, false},
		{"one busy claim", 200, []types.UID{"idle", "busy"}, false},
		{"one claim without samples", 200, []types.UID{"idle", "unknown"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Judge(at(tc.now), p, tc.claims, h)
			if v.Idle != tc.idle {
				t.Fatalf("idle = %v (%s); want %v", v.Idle, v.Why, tc.idle)
			}
		})
	}
	w := JudgeWorkload([]Verdict{Judge(at(100), p, []types.UID{"idle"}, h), Judge(at(100), p, []types.UID{"busy"}, h)})
	if w.Idle {
		t.Error("a gang with a busy member is idle")
	}
	w = JudgeWorkload([]Verdict{Judge(at(100), p, []types.UID{"idle"}, h), Judge(at(100), p, []types.UID{"idle-late"}, h)})
	if !w.Idle || !w.Since.Equal(at(30)) {
		t.Errorf("gang of idle members: %+v; want idle since minute 30", w)
	}
	if got := Message(at(100), p, w); got != "claims used at most 1% of their allocation (threshold 5%) since 2026-01-01T00:30:00Z, 1h10m0s (window 1h0m0s)" {
		t.Errorf("message %q", got)
	}
}
