// Package featuregates holds Tessera's own feature gates (k8s.io/component-base
// featuregate): one gate per binary, filled by its --feature-gates flag
// (pkg/cli), passed to the code in the binary's options. Alpha gates are
// off by default, beta gates on. docs/compatibility.md lists them.
package featuregates

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
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

// Version is Tessera's major.minor version (the chart's appVersion): a
// gate is at the stage and default its specs give for it. A promotion
// appends a spec at the release that makes it, as Kubernetes' own gates
// do (k8s.io/component-base/featuregate VersionedSpecs), so that each
// gate's history stays readable.
var Version = version.MajorMinor(0, 1)

// v0_1 is Tessera 0.1, where every gate below first appeared.
var v0_1 = version.MajorMinor(0, 1)

// Gate is one of Tessera's gates with what it gates, for docs and errors.
type Gate struct {
	Name featuregate.Feature
	// Specs are the gate's stages, oldest first, each from the release
	// that set it.
	Specs featuregate.VersionedSpecs
	// What the gate turns on, as docs/compatibility.md says it.
	What string
}

func alpha(since *version.Version) featuregate.FeatureSpec {
	return featuregate.FeatureSpec{Version: since, Default: false, PreRelease: featuregate.Alpha}
}

func beta(since *version.Version) featuregate.FeatureSpec {
	return featuregate.FeatureSpec{Version: since, Default: true, PreRelease: featuregate.Beta}
}

// Plugin are the kubelet plugin's gates.
func Plugin() []Gate {
	return []Gate{
		{DynamicMIG, featuregate.VersionedSpecs{beta(v0_1)}, "--mig-mode=dynamic (the default mode)"},
		{PerClaimMPS, featuregate.VersionedSpecs{beta(v0_1)}, "--mps-control: one MPS control daemon per claim"},
		{MPSDaemonPods, featuregate.VersionedSpecs{alpha(v0_1)}, "--mps-mode=pod: the per-claim MPS daemons in pods of their own"},
	}
}

// Controller are the queue controller's gates.
func Controller() []Gate {
	return []Gate{
		{TimeBasedFairShare, featuregate.VersionedSpecs{alpha(v0_1)}, "Queue spec.fairSharing.usageWeighting (time-based fair share)"},
		{IdleReclaim, featuregate.VersionedSpecs{alpha(v0_1)}, "Queue spec.idle (idle reclaim)"},
		{CanaryControllers, featuregate.VersionedSpecs{alpha(v0_1)}, "--controller-name other than default (a canary controller)"},
		{ShadowMode, featuregate.VersionedSpecs{alpha(v0_1)}, "--shadow (a shadow controller)"},
	}
}

// New returns a gate that knows gates, at their defaults in Version;
// --feature-gates (featuregate's AddFlag) or SetFromMap changes them.
func New(gates []Gate) featuregate.MutableVersionedFeatureGate {
	return newAt(Version, gates)
}

func newAt(v *version.Version, gates []Gate) featuregate.MutableVersionedFeatureGate {
	g := featuregate.NewVersionedFeatureGate(v)
	specs := make(map[featuregate.Feature]featuregate.VersionedSpecs, len(gates))
	for _, x := range gates {
		specs[x.Name] = x.Specs
	}
	if err := g.AddVersioned(specs); err != nil {
		panic(err) // distinct names, ordered specs: a programming error
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
	spec, ok := New(gates).GetAll()[feature]
	switch {
	case !ok:
		return "unknown"
	case spec.PreRelease == featuregate.GA:
		return "GA"
	}
	return strings.ToLower(string(spec.PreRelease))
}
