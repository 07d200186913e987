package decide

import (
	"context"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
)

// TaintRuleLister lists the cluster's DeviceTaintRules (Config.TaintRules).
type TaintRuleLister func(ctx context.Context) ([]*resourceapi.DeviceTaintRule, error)

// taintMemo keeps the slices patched with DeviceTaintRules while neither
// the rules nor a slice change, so that the engine's caches, keyed by the
// slice objects, survive cycles.
type taintMemo struct {
	sig     string
	patched map[*resourceapi.ResourceSlice]*resourceapi.ResourceSlice
}

// withTaintRules returns the slices as kube-scheduler sees them: with the
// taint of every matching DeviceTaintRule appended to the device's own
// taints. The allocator then refuses tainted devices whose NoSchedule or
// NoExecute taints a request does not tolerate, as in the scheduler.
func (e *Engine) withTaintRules(slices []*resourceapi.ResourceSlice, rules []*resourceapi.DeviceTaintRule) []*resourceapi.ResourceSlice {
	if len(rules) == 0 {
		e.taints = nil
		return slices
	}
	sig := taintRulesSignature(rules)
	if e.taints == nil || e.taints.sig != sig {
		e.taints = &taintMemo{sig: sig, patched: map[*resourceapi.ResourceSlice]*resourceapi.ResourceSlice{}}
	}
	out := make([]*resourceapi.ResourceSlice, len(slices))
	next := make(map[*resourceapi.ResourceSlice]*resourceapi.ResourceSlice, len(slices))
	for i, s := range slices {
		p, ok := e.taints.patched[s]
		if !ok {
			p = ApplyTaintRules(s, rules)
		}
		out[i], next[s] = p, p
	}
	e.taints.patched = next
	return out
}

func taintRulesSignature(rules []*resourceapi.DeviceTaintRule) string {
	var b strings.Builder
	for _, r := range rules {
		fmt.Fprintf(&b, "%s/%s/%d;", r.UID, r.ResourceVersion, r.Generation)
		if r.ResourceVersion == "" { // objects built in tests
			fmt.Fprintf(&b, "%p;", r)
		}
	}
	return b.String()
}

// ApplyTaintRules returns the slice with the taint of every matching rule
// appended to its devices, or the slice itself when none matches. It
// follows the scheduler's ResourceSlice tracker
// (k8s.io/dynamic-resource-allocation/resourceslice/tracker, applyPatches):
// a rule without a selector matches nothing, the empty selector every
// device; driver, pool and device narrow it down; rules apply in the
// order given.
func ApplyTaintRules(slice *resourceapi.ResourceSlice, rules []*resourceapi.DeviceTaintRule) *resourceapi.ResourceSlice {
	patched := slice
	for _, rule := range rules {
		sel := rule.Spec.DeviceSelector
		if sel == nil {
			continue
		}
		if sel.Driver != nil && *sel.Driver != slice.Spec.Driver {
			continue
		}
		if sel.Pool != nil && *sel.Pool != slice.Spec.Pool.Name {
			continue
		}
		for i, d := range slice.Spec.Devices {
			if sel.Device != nil && *sel.Device != d.Name {
				continue
			}
			if patched == slice {
				patched = slice.DeepCopy()
			}
			patched.Spec.Devices[i].Taints = append(patched.Spec.Devices[i].Taints, rule.Spec.Taint)
		}
	}
	return patched
}
