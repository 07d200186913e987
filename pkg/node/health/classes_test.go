package health

import (
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
)

func TestClassify(t *testing.T) {
	ignored := map[uint64]bool{}
	for _, x := range DefaultIgnoredXIDs {
		ignored[x] = true
	}
	for _, tc := range []struct {
		xid   uint64
		key   string
		fatal bool
	}{
		{13, KeyAppXID, false},
		{31, KeyAppXID, false},
		{43, KeyAppXID, false},
		{45, KeyAppXID, false},
		{68, KeyAppXID, false},
		{109, KeyAppXID, false},
		{79, KeyGPULost, true},
		{48, KeyECC, true},
		{94, KeyECC, true},
		{95, KeyECC, true},
		{62, KeyXID, true},
		{119, KeyXID, true},
	} {
		key, fatal := Classify(tc.xid, ignored)
		if key != tc.key || fatal != tc.fatal {
			t.Errorf("XID %d: %s fatal=%v, want %s fatal=%v", tc.xid, key, fatal, tc.key, tc.fatal)
		}
	}
}

func TestParseFatalEffect(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want resourceapi.DeviceTaintEffect
		err  bool
	}{
		{"", resourceapi.DeviceTaintEffectNoSchedule, false},
		{"NoSchedule", resourceapi.DeviceTaintEffectNoSchedule, false},
		{"NoExecute", resourceapi.DeviceTaintEffectNoExecute, false},
		{"None", "", true},
		{"noexecute", "", true},
	} {
		got, err := ParseFatalEffect(tc.in)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("%q: %q, %v", tc.in, got, err)
		}
	}
}

// clock is a settable test clock.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

// TestTaintsAndRecovery drives events and probes with a test clock: the
// taint per cause, its effect, and when it goes.
func TestTaintsAndRecovery(t *testing.T) {
	type step struct {
		at      time.Duration // since the start
		xid     uint64        // 0: none
		dbe     bool          // a double-bit ECC event instead
		lost    bool          // the GPU falls off the bus (mock)
		recover bool          // the mock GPU comes back
		probe   bool
	}
	for _, tc := range []struct {
		name     string
		effect   resourceapi.DeviceTaintEffect
		holdDown time.Duration
		steps    []step
		want     map[string]resourceapi.DeviceTaintEffect // key -> effect on gpu-1
		healthy  bool
	}{{
		name: "application XID is informational", holdDown: time.Minute,
		steps: []step{{xid: 13}},
		want:  map[string]resourceapi.DeviceTaintEffect{KeyAppXID: resourceapi.DeviceTaintEffectNone}, healthy: true,
	}, {
		name: "informational taint goes after the hold-down", holdDown: time.Minute,
		steps: []step{{xid: 43}, {at: 61 * time.Second, probe: true}},
		want:  map[string]resourceapi.DeviceTaintEffect{}, healthy: true,
	}, {
		name: "critical XID", holdDown: time.Minute,
		steps: []step{{xid: 62}},
		want:  map[string]resourceapi.DeviceTaintEffect{KeyXID: resourceapi.DeviceTaintEffectNoSchedule},
	}, {
		name: "NoExecute when configured", effect: resourceapi.DeviceTaintEffectNoExecute, holdDown: time.Minute,
		steps: []step{{dbe: true}, {xid: 31}},
		want: map[string]resourceapi.DeviceTaintEffect{KeyECC: resourceapi.DeviceTaintEffectNoExecute,
			KeyAppXID: resourceapi.DeviceTaintEffectNone},
	}, {
		name: "still within the hold-down", holdDown: time.Minute,
		steps: []step{{xid: 62}, {at: 30 * time.Second, probe: true}, {at: 50 * time.Second, xid: 62}, {at: 100 * time.Second, probe: true}},
		want:  map[string]resourceapi.DeviceTaintEffect{KeyXID: resourceapi.DeviceTaintEffectNoSchedule},
	}, {
		name: "cleared after the hold-down", holdDown: time.Minute,
		steps: []step{{xid: 62}, {at: 30 * time.Second, probe: true}, {at: 61 * time.Second, probe: true}},
		want:  map[string]resourceapi.DeviceTaintEffect{}, healthy: true,
	}, {
		name: "hold-down 0 never clears", holdDown: 0,
		steps: []step{{xid: 62}, {at: time.Hour, probe: true}},
		want:  map[string]resourceapi.DeviceTaintEffect{KeyXID: resourceapi.DeviceTaintEffectNoSchedule},
	}, {
		name: "lost GPU stays tainted while it does not answer", holdDown: time.Minute,
		steps: []step{{xid: 79, lost: true}, {at: time.Hour, probe: true}},
		want:  map[string]resourceapi.DeviceTaintEffect{KeyGPULost: resourceapi.DeviceTaintEffectNoSchedule},
	}, {
		name: "lost GPU recovers a hold-down after it answers again", holdDown: time.Minute,
		steps: []step{{xid: 79, lost: true}, {at: time.Hour, probe: true}, {at: time.Hour, recover: true},
			{at: time.Hour + 30*time.Second, probe: true}, {at: time.Hour + 61*time.Second, probe: true}},
		want: map[string]resourceapi.DeviceTaintEffect{}, healthy: true,
	}, {
		name: "a GPU that stops answering without an event", holdDown: time.Minute,
		steps: []step{{lost: true}, {probe: true}},
		want:  map[string]resourceapi.DeviceTaintEffect{KeyGPULost: resourceapi.DeviceTaintEffectNoSchedule},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, srv, inv, names := setup(t, "t4:2", false)
			start := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
			clk := &clock{now: start}
			m := New(srv, "node", Options{IgnoredXIDs: DefaultIgnoredXIDs, FatalEffect: tc.effect, HoldDown: tc.holdDown, Now: clk.Now})
			dev, _ := srv.DeviceGetHandleByUUID(inv.GPUs[1].UUID)
			for _, s := range tc.steps {
				clk.now = start.Add(s.at)
				if s.lost {
					if err := srv.InjectXID(inv.GPUs[1].UUID, 79); err != nil { // marks it lost
						t.Fatal(err)
					}
				}
				if s.recover {
					if err := srv.InjectRecovery(inv.GPUs[1].UUID); err != nil {
						t.Fatal(err)
					}
				}
				switch {
				case s.dbe:
					m.handle(ctx, nvml.EventData{Device: dev, EventType: nvml.EventTypeDoubleBitEccError, GpuInstanceId: noInstance})
				case s.xid != 0:
					m.handle(ctx, nvml.EventData{Device: dev, EventType: nvml.EventTypeXidCriticalError, EventData: s.xid, GpuInstanceId: noInstance})
				}
				if s.probe {
					m.Probe(ctx, inv)
				}
			}
			taints := m.Taints(inv, names)
			got := map[string]resourceapi.DeviceTaintEffect{}
			for _, tt := range taints["gpu-1-ts-0"] {
				got[tt.Key] = tt.Effect
				if tt.TimeAdded == nil || tt.TimeAdded.Time.Before(start) || tt.Value == "" {
					t.Errorf("taint %+v", tt)
				}
			}
			if len(got) != len(tc.want) {
				t.Errorf("taints %v, want %v", got, tc.want)
			}
			for k, e := range tc.want {
				if got[k] != e {
					t.Errorf("taints %v, want %v", got, tc.want)
				}
			}
			if len(taints["gpu-0"]) != 0 {
				t.Errorf("gpu-0 tainted: %v", taints["gpu-0"])
			}
			if ok, why := m.Health(inv, "gpu-1"); ok != tc.healthy {
				t.Errorf("healthy %v (%s), want %v", ok, why, tc.healthy)
			}
		})
	}
}
