package allocation

import (
	"strings"
	"testing"

	"k8s.io/dynamic-resource-allocation/structured"
)

func TestFeaturesFor(t *testing.T) {
	for _, tt := range []struct {
		version string
		want    structured.Features
		err     string
	}{
		{version: "v1.33.4", err: "Kubernetes 1.34 or newer"},
		{version: "v1.34.1", want: structured.Features{AdminAccess: true, PrioritizedList: true}},
		{version: "v1.35.0", want: structured.Features{AdminAccess: true, PrioritizedList: true}},
		{version: "v1.36.2-gke.1200", want: structured.Features{AdminAccess: true, PrioritizedList: true,
			ConsumableCapacity: true, PartitionableDevices: true, DeviceTaints: true, DeviceBindingAndStatus: true}},
		{version: "v1.37.1", want: SchedulerFeatures},
		{version: "1.39.0", want: SchedulerFeatures},
		{version: "not-a-version", err: "not-a-version"},
	} {
		got, err := FeaturesFor(tt.version)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: error %v, want %q", tt.version, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: %+v, %v; want %+v", tt.version, got, err, tt.want)
		}
	}
}

func TestOverride(t *testing.T) {
	base, _ := FeaturesFor("v1.35.0")
	got, err := Override(base, "DRAConsumableCapacity=true, DRAPartitionableDevices=true,DRAPrioritizedList=false")
	if err != nil {
		t.Fatal(err)
	}
	want := structured.Features{AdminAccess: true, ConsumableCapacity: true, PartitionableDevices: true}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	for _, bad := range []string{"DRAConsumableCapacity", "DRAConsumableCapacity=maybe", "DynamicResourceAllocation=true"} {
		if _, err := Override(base, bad); err == nil || !strings.Contains(err.Error(), "feature gate") {
			t.Errorf("%q: error %v", bad, err)
		}
	}
}
