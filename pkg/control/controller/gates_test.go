package controller

import (
	"testing"

	"k8s.io/client-go/tools/cache"
	"k8s.io/component-base/featuregate"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/featuregates"
)

// testGates returns the controller's gates set as --feature-gates=value
// would.
func testGates(t *testing.T, value string) featuregate.FeatureGate {
	t.Helper()
	g := featuregates.New(featuregates.Controller())
	if err := g.Set(value); err != nil {
		t.Fatal(err)
	}
	return g
}

// With TimeBasedFairShare off the cache holds Queues without
// spec.fairSharing.usageWeighting; on, they keep it.
func TestGatedQueueFields(t *testing.T) {
	for _, tc := range []struct {
		name  string
		gates featuregate.FeatureGate
		keep  bool
	}{
		{"gate at its default (off)", nil, false},
		{"gate on", testGates(t, "TimeBasedFairShare=true"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := &v1alpha1.Queue{Spec: v1alpha1.QueueSpec{FairSharing: &v1alpha1.FairSharing{UsageWeighting: &v1alpha1.UsageWeighting{Enabled: true}}}}
			transform := gatedQueueFields(Options{Gates: tc.gates})
			if tc.keep {
				if transform != nil {
					t.Fatal("a transform with the gate on")
				}
				return
			}
			got, err := cache.TransformFunc(transform)(q)
			if err != nil {
				t.Fatal(err)
			}
			if w := got.(*v1alpha1.Queue).Spec.FairSharing.UsageWeighting; w != nil {
				t.Errorf("usageWeighting %+v kept with the gate off", w)
			}
		})
	}
}
