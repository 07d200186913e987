package decidetest

import (
	"fmt"

	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-dev/tessera/pkg/control/allocation"
)

// Gates are the scheduler feature gates docs/compatibility.md asks 1.34
// and 1.35 clusters to turn on, in --scheduler-feature-gates syntax.
const Gates = "DRAConsumableCapacity=true,DRAPartitionableDevices=true,DRADeviceTaints=true"

// FeatureSets are the allocator features under which Tessera's devices can
// be allocated, for every Kubernetes version the controller supports, by
// name: the defaults of the versions that have what Tessera publishes
// ("v1.36.0", "v1.37.0"), and the older ones with Gates on
// ("v1.34.0+gates", "v1.35.0+gates").
func FeatureSets() map[string]structured.Features {
	out := map[string]structured.Features{}
	for minor := allocation.OldestSupported; minor <= allocation.NewestKnown; minor++ {
		v := fmt.Sprintf("v1.%d.0", minor)
		f, err := allocation.FeaturesFor(v)
		if err != nil {
			panic(err) // every supported version parses
		}
		if !Usable(f) {
			if f, err = allocation.Override(f, Gates); err != nil {
				panic(err) // Gates are all known
			}
			v += "+gates"
		}
		out[v] = f
	}
	return out
}

// Usable says whether Tessera's devices can be allocated with f: shares
// need consumable capacity, MIG and time slices counters.
func Usable(f structured.Features) bool { return f.ConsumableCapacity && f.PartitionableDevices }
