package allocation

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/dynamic-resource-allocation/structured"
)

// gateSince is a DRA feature gate of kube-scheduler and the first minor
// release of Kubernetes 1.x in which it is on by default (k8s.io/kubernetes
// pkg/featuregates/kube_features.go, v1.37.1).
var gateSince = []struct {
	gate  string
	minor uint
	field func(*structured.Features) *bool
}{
	{"DRAAdminAccess", 34, func(f *structured.Features) *bool { return &f.AdminAccess }},
	{"DRAPrioritizedList", 34, func(f *structured.Features) *bool { return &f.PrioritizedList }},
	{"DRAConsumableCapacity", 36, func(f *structured.Features) *bool { return &f.ConsumableCapacity }},
	{"DRAPartitionableDevices", 36, func(f *structured.Features) *bool { return &f.PartitionableDevices }},
	{"DRADeviceTaints", 36, func(f *structured.Features) *bool { return &f.DeviceTaints }},
	{"DRADeviceBindingConditions", 36, func(f *structured.Features) *bool { return &f.DeviceBindingAndStatus }},
	{"DRAFractionalCapacityRange", 37, func(f *structured.Features) *bool { return &f.FractionalCapacityRange }},
}

// OldestSupported and NewestKnown bound the Kubernetes versions whose
// scheduler defaults FeaturesFor knows; newer ones get NewestKnown's.
const (
	OldestSupported = 34
	NewestKnown     = 37
)

// FeaturesFor returns the allocator features kube-scheduler of the given
// Kubernetes version (e.g. "v1.35.2", "1.36.0-gke.100") enables by default.
// The admission simulation must use the cluster's own, or it accepts
// placements the scheduler refuses (or the other way round).
func FeaturesFor(gitVersion string) (structured.Features, error) {
	var f structured.Features
	v, err := version.ParseGeneric(gitVersion)
	if err != nil {
		return f, fmt.Errorf("Kubernetes version %q: %w", gitVersion, err)
	}
	if v.Major() != 1 || v.Minor() < OldestSupported {
		return f, fmt.Errorf("Kubernetes %s is not supported: Tessera needs resource.k8s.io/v1, Kubernetes 1.%d or newer", gitVersion, OldestSupported)
	}
	for _, g := range gateSince {
		*g.field(&f) = v.Minor() >= g.minor
	}
	return f, nil
}

// Override applies feature gate settings in the kube-scheduler's
// --feature-gates syntax ("DRAConsumableCapacity=true,DRADeviceTaints=false")
// for clusters that turn gates on or off: only the DRA gates the
// allocator knows are accepted.
func Override(f structured.Features, gates string) (structured.Features, error) {
	if strings.TrimSpace(gates) == "" {
		return f, nil
	}
	for _, kv := range strings.Split(gates, ",") {
		name, value, ok := strings.Cut(strings.TrimSpace(kv), "=")
		on, err := strconv.ParseBool(value)
		if !ok || err != nil {
			return f, fmt.Errorf("feature gate %q: write <gate>=true or <gate>=false", kv)
		}
		found := false
		for _, g := range gateSince {
			if g.gate == name {
				*g.field(&f) = on
				found = true
			}
		}
		if !found {
			return f, fmt.Errorf("feature gate %q is not one the scheduler's allocator reads; known: %s", name, strings.Join(KnownGates(), ", "))
		}
	}
	return f, nil
}

// KnownGates lists the gates Override accepts, sorted.
func KnownGates() []string {
	var out []string
	for _, g := range gateSince {
		out = append(out, g.gate)
	}
	sort.Strings(out)
	return out
}
