// Package featuregates holds Tessera's own feature gates (k8s.io/component-base
// featuregate): one gate per binary, filled by its --feature-gates flag
// (pkg/cli), passed to the code in the binary's options. Alpha gates are
// off by default, beta gates on. docs/compatibility.md lists them.
package featuregates

import (
	"fmt"
	"strings"

	"k8s.io/component-base/featuregate"
)

// The gates. A gate's name is a contract with users (their
// --feature-gates and the chart's featureGates values).
const (
	// DynamicMIG (kubelet plugin): --mig-mode=dynamic, MIG partitions
	// published as profile x placement and created at prepare.
	DynamicMIG featuregate.Feature = "DynamicMIG"
	// PerClaimMPS (kubelet plugin): --mps-control, one MPS control daemon
	// per claim with daemon-side limits.
	PerClaimMPS featuregate.Feature = "PerClaimMPS"
	// MPSDaemonPods (kubelet plugin): --mps-mode=pod, the per-claim MPS
	// daemons in pods of their own.
	MPSDaemonPods featuregate.Feature = "MPSDaemonPods"

	// TimeBasedFairShare (controller): Queue
	// spec.fairSharing.usageWeighting, over-quota weights divided by the
	// children's decayed usage.
	TimeBasedFairShare featuregate.Feature = "TimeBasedFairShare"
	// IdleReclaim (controller): Queue spec.idle, idle pods marked and,
	// with action Evict, evicted.
	IdleReclaim featuregate.Feature = "IdleReclaim"
	// CanaryControllers (controller): --controller-name other than
	// default, a second controller release that decides the queues whose
	// spec.controllerName names it.
	CanaryControllers featuregate.Feature = "CanaryControllers"
	// ShadowMode (controller): --shadow, a controller that decides,
	// compares and writes only its report.
	ShadowMode featuregate.Feature = "ShadowMode"
)

// Since is the Tessera version every gate above first appeared in.
const Since = "0.1.0"

// Gate is one of Tessera's gates with what it gates, for docs and errors.
type Gate struct {
	Name featuregate.Feature
	Spec featuregate.FeatureSpec
	// What the gate turns on, as docs/compatibility.md says it.
	What string
}

// Plugin are the kubelet plugin's gates.
func Plugin() []Gate {
	return []Gate{
		{DynamicMIG, featuregate.FeatureSpec{Default: true, PreRelease: featuregate.Beta}, "--mig-mode=dynamic (the default mode)"},
		{PerClaimMPS, featuregate.FeatureSpec{Default: true, PreRelease: featuregate.Beta}, "--mps-control: one MPS control daemon per claim"},
		{MPSDaemonPods, featuregate.FeatureSpec{Default: false, PreRelease: featuregate.Alpha}, "--mps-mode=pod: the per-claim MPS daemons in pods of their own"},
	}
}

// Controller are the queue controller's gates.
func Controller() []Gate {
	return []Gate{
		{TimeBasedFairShare, featuregate.FeatureSpec{Default: false, PreRelease: featuregate.Alpha}, "Queue spec.fairSharing.usageWeighting (time-based fair share)"},
		{IdleReclaim, featuregate.FeatureSpec{Default: false, PreRelease: featuregate.Alpha}, "Queue spec.idle (idle reclaim)"},
		{CanaryControllers, featuregate.FeatureSpec{Default: false, PreRelease: featuregate.Alpha}, "--controller-name other than default (a canary controller)"},
		{ShadowMode, featuregate.FeatureSpec{Default: false, PreRelease: featuregate.Alpha}, "--shadow (a shadow controller)"},
	}
}

// New returns a gate that knows gates, at their defaults; --feature-gates
// (featuregate's AddFlag) or SetFromMap changes them.
func New(gates []Gate) featuregate.MutableVersionedFeatureGate {
	g := featuregate.NewFeatureGate()
	specs := make(map[featuregate.Feature]featuregate.FeatureSpec, len(gates))
	for _, x := range gates {
		specs[x.Name] = x.Spec
	}
	if err := g.Add(specs); err != nil {
		panic(err) // the names above are distinct: a programming error
	}
	return g
}

// Enabled says whether feature is on in g; a nil g (options built in
// code, not from flags) has the defaults of gates.
func Enabled(g featuregate.FeatureGate, gates []Gate, feature featuregate.Feature) bool {
	if g == nil {
		g = New(gates)
	}
	return g.Enabled(feature)
}

// Require returns an error naming the gate when use (what the user asked
// for, e.g. "--mps-mode=pod") needs feature and g has it off.
func Require(g featuregate.FeatureGate, gates []Gate, feature featuregate.Feature, use string) error {
	if Enabled(g, gates, feature) {
		return nil
	}
	return fmt.Errorf("%s needs --feature-gates=%s=true (the feature is %s; see docs/compatibility.md#tesseras-feature-gates)", use, feature, stage(gates, feature))
}

func stage(gates []Gate, feature featuregate.Feature) string {
	for _, x := range gates {
		if x.Name == feature {
			if x.Spec.PreRelease == featuregate.GA {
				return "GA"
			}
			return strings.ToLower(string(x.Spec.PreRelease))
		}
	}
	return "unknown"
}
