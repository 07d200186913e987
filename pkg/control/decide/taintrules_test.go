package decide_test

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/control/decide"
	. "github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/node/health"
)

func rule(name string, sel *resourceapi.DeviceTaintSelector, key string, effect resourceapi.DeviceTaintEffect) *resourceapi.DeviceTaintRule {
	return &resourceapi.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceTaintRuleSpec{DeviceSelector: sel, Taint: resourceapi.DeviceTaint{Key: key, Value: "x", Effect: effect}}}
}

// TestDeviceTaintsAndRules runs the admission simulation, the real
// allocator with the scheduler's features, over a node of two GPUs whose
// devices carry published taints or are tainted by DeviceTaintRules.
func TestDeviceTaintsAndRules(t *testing.T) {
	noSchedule, noExecute, none := resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute, resourceapi.DeviceTaintEffectNone
	driver := ptr.To(devicemodel.DriverName)
	gpu0 := &resourceapi.DeviceTaintSelector{Driver: driver, Pool: ptr.To("n1"), Device: ptr.To("gpu-0")}
	wholeNode := &resourceapi.DeviceTaintSelector{Driver: driver, Pool: ptr.To("n1")}
	for _, tc := range []struct {
		name string
		// published taints every device of GPU 0 (prefix gpu-0) gets, as
		// the plugin's health monitor publishes them.
		published []resourceapi.DeviceTaint
		rules     []*resourceapi.DeviceTaintRule
		// tolerations of the claim's request.
		tolerations []resourceapi.DeviceToleration
		gpus        int64 // whole GPUs the claim asks for
		admitted    bool
	}{
		{name: "untainted", gpus: 2, admitted: true},
		{name: "published NoSchedule keeps the device out", gpus: 2,
			published: []resourceapi.DeviceTaint{{Key: health.KeyXID, Value: "xid-62", Effect: noSchedule}}},
		{name: "published NoSchedule leaves the other GPU", gpus: 1, admitted: true,
			published: []resourceapi.DeviceTaint{{Key: health.KeyXID, Value: "xid-62", Effect: noSchedule}}},
		{name: "published NoExecute keeps the device out", gpus: 2,
			published: []resourceapi.DeviceTaint{{Key: health.KeyGPULost, Value: "xid-79", Effect: noExecute}}},
		{name: "published None does not block", gpus: 2, admitted: true,
			published: []resourceapi.DeviceTaint{{Key: health.KeyAppXID, Value: "xid-13", Effect: none}}},
		{name: "tolerated by key", gpus: 2, admitted: true,
			published:   []resourceapi.DeviceTaint{{Key: health.KeyXID, Value: "xid-62", Effect: noSchedule}},
			tolerations: []resourceapi.DeviceToleration{{Key: health.KeyXID, Operator: resourceapi.DeviceTolerationOpExists}}},
		{name: "toleration of another key", gpus: 2,
			published:   []resourceapi.DeviceTaint{{Key: health.KeyXID, Value: "xid-62", Effect: noSchedule}},
			tolerations: []resourceapi.DeviceToleration{{Key: health.KeyECC, Operator: resourceapi.DeviceTolerationOpExists}}},
		{name: "toleration of another value", gpus: 2,
			published:   []resourceapi.DeviceTaint{{Key: health.KeyXID, Value: "xid-62", Effect: noSchedule}},
			tolerations: []resourceapi.DeviceToleration{{Key: health.KeyXID, Operator: resourceapi.DeviceTolerationOpEqual, Value: "xid-31"}}},
		{name: "rule NoSchedule on one device", gpus: 2,
			rules: []*resourceapi.DeviceTaintRule{rule("r", gpu0, "example.com/maintenance", noSchedule)}},
		{name: "rule NoSchedule on one device leaves the other", gpus: 1, admitted: true,
			rules: []*resourceapi.DeviceTaintRule{rule("r", gpu0, "example.com/maintenance", noSchedule)}},
		{name: "rule on the whole pool", gpus: 1,
			rules: []*resourceapi.DeviceTaintRule{rule("r", wholeNode, "example.com/maintenance", noExecute)}},
		{name: "rule with effect None", gpus: 2, admitted: true,
			rules: []*resourceapi.DeviceTaintRule{rule("r", wholeNode, "example.com/maintenance", none)}},
		{name: "rule tolerated", gpus: 2, admitted: true,
			rules:       []*resourceapi.DeviceTaintRule{rule("r", wholeNode, "example.com/maintenance", noSchedule)},
			tolerations: []resourceapi.DeviceToleration{{Key: "example.com/maintenance", Operator: resourceapi.DeviceTolerationOpEqual, Value: "x", Effect: noSchedule}}},
		{name: "rule of another driver", gpus: 2, admitted: true,
			rules: []*resourceapi.DeviceTaintRule{rule("r", &resourceapi.DeviceTaintSelector{Driver: ptr.To("nic.example.com")}, "example.com/maintenance", noSchedule)}},
		{name: "rule of another pool", gpus: 2, admitted: true,
			rules: []*resourceapi.DeviceTaintRule{rule("r", &resourceapi.DeviceTaintSelector{Pool: ptr.To("n2")}, "example.com/maintenance", noSchedule)}},
		{name: "rule without a selector matches nothing", gpus: 2, admitted: true,
			rules: []*resourceapi.DeviceTaintRule{rule("r", nil, "example.com/maintenance", noSchedule)}},
		{name: "empty selector matches every device", gpus: 1,
			rules: []*resourceapi.DeviceTaintRule{rule("r", &resourceapi.DeviceTaintSelector{}, "example.com/maintenance", noSchedule)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg()
			listed := 0
			c.TaintRules = func(context.Context) ([]*resourceapi.DeviceTaintRule, error) {
				listed++
				return tc.rules, nil
			}
			w := newWorld(t, c)
			w.node("n1", NodeOptions{Profile: "h100-80gb:2"})
			for i, s := range w.snap.Slices {
				s = s.DeepCopy()
				for j := range s.Spec.Devices {
					if d := &s.Spec.Devices[j]; d.Name == "gpu-0" || len(d.Name) > 6 && d.Name[:6] == "gpu-0-" {
						d.Taints = append(d.Taints, tc.published...)
					}
				}
				w.snap.Slices[i] = s
			}
			w.queue(Queue("team-a", "", "", ""))
			tmpl := Template("ns", "gpus", Request{Count: tc.gpus})
			tmpl.Spec.Spec.Devices.Requests[0].Exactly.Tolerations = tc.tolerations
			w.template(tmpl)
			w.pod("p1", PodOptions{Queue: "team-a", Templates: []string{"gpus"}})
			w.cycle()
			if tc.admitted {
				expectAdmitted(t, w, "p1")
			} else {
				expectAdmitted(t, w)
			}
			if listed != 1 {
				t.Errorf("rules listed %d times in a cycle", listed)
			}
		})
	}
}

func TestApplyTaintRulesLeavesUnmatchedSlices(t *testing.T) {
	s := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: "d", Pool: resourceapi.ResourcePool{Name: "p"},
		Devices: []resourceapi.Device{{Name: "a"}, {Name: "b"}}}}
	if got := decide.ApplyTaintRules(s, []*resourceapi.DeviceTaintRule{rule("r", &resourceapi.DeviceTaintSelector{Driver: ptr.To("other")}, "k", "NoSchedule")}); got != s {
		t.Error("an unmatched slice was copied")
	}
	got := decide.ApplyTaintRules(s, []*resourceapi.DeviceTaintRule{
		rule("r1", &resourceapi.DeviceTaintSelector{Device: ptr.To("b")}, "k1", "NoSchedule"),
		rule("r2", &resourceapi.DeviceTaintSelector{}, "k2", "None"),
	})
	if got == s || len(s.Spec.Devices[1].Taints) != 0 {
		t.Fatal("the slice was modified in place")
	}
	if a, b := got.Spec.Devices[0].Taints, got.Spec.Devices[1].Taints; len(a) != 1 || a[0].Key != "k2" || len(b) != 2 || b[0].Key != "k1" || b[1].Key != "k2" {
		t.Errorf("taints %+v %+v", a, b)
	}
}
