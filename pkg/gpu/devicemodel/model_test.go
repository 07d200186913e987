package devicemodel_test

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/cel"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/discover"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/gpu/nodeslices"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
)

// validateSlices checks what the API server and the allocator would reject.
func validateSlices(t *testing.T, slices []*resourceapi.ResourceSlice) {
	t.Helper()
	sets := map[string]resourceapi.CounterSet{}
	names := map[string]bool{}
	for _, s := range slices {
		if len(s.Spec.Devices) > 0 && len(s.Spec.SharedCounters) > 0 {
			t.Errorf("slice %s holds devices and counters", s.Name)
		}
		if len(s.Spec.SharedCounters) > resourceapi.ResourceSliceMaxCounterSets {
			t.Errorf("slice %s: %d counter sets", s.Name, len(s.Spec.SharedCounters))
		}
		for _, cs := range s.Spec.SharedCounters {
			if len(cs.Counters) > resourceapi.ResourceSliceMaxCountersPerCounterSet {
				t.Errorf("counter set %s: %d counters", cs.Name, len(cs.Counters))
			}
			sets[cs.Name] = cs
		}
		advanced := false
		for _, d := range s.Spec.Devices {
			advanced = advanced || len(d.ConsumesCounters) > 0 || len(d.Taints) > 0
		}
		limit := resourceapi.ResourceSliceMaxDevices
		if advanced {
			limit = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
		}
		if len(s.Spec.Devices) > limit {
			t.Errorf("slice %s: %d devices, limit %d", s.Name, len(s.Spec.Devices), limit)
		}
		if s.Spec.Pool.ResourceSliceCount != int64(len(slices)) {
			t.Errorf("slice %s: resourceSliceCount %d, want %d", s.Name, s.Spec.Pool.ResourceSliceCount, len(slices))
		}
	}
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			if errs := validation.IsDNS1123Label(d.Name); len(errs) > 0 {
				t.Errorf("device name %q: %v", d.Name, errs)
			}
			if names[d.Name] {
				t.Errorf("duplicate device %s", d.Name)
			}
			names[d.Name] = true
			if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
				t.Errorf("device %s: %d attributes and capacities", d.Name, n)
			}
			if len(d.ConsumesCounters) > resourceapi.ResourceSliceMaxDeviceCounterConsumptionsPerDevice {
				t.Errorf("device %s consumes %d counter sets", d.Name, len(d.ConsumesCounters))
			}
			for _, cc := range d.ConsumesCounters {
				set, ok := sets[cc.CounterSet]
				if !ok {
					t.Errorf("device %s: unknown counter set %s", d.Name, cc.CounterSet)
				}
				for c := range cc.Counters {
					if _, ok := set.Counters[c]; !ok {
						t.Errorf("device %s: counter %s not in set %s", d.Name, c, cc.CounterSet)
					}
				}
			}
			if _, err := devicemodel.ParseName(d.Name); err != nil {
				t.Error(err)
			}
		}
	}
}

func TestSlicesRespectAPILimits(t *testing.T) {
	for _, tc := range []nodeOpts{
		{profile: "t4"},
		{profile: "t4", timeSlices: 4},
		{profile: "dgxh100", mig: true},
		{profile: "dgxb200", mig: true},
		{profile: "dgxh200", mig: true},
		{profile: "dgxa100", mig: true},
		{profile: "dgxh100", timeSlices: 32},
		{profile: "t4:16,l4:16,a10:16", timeSlices: 8},
		{profile: "t4:64"},
	} {
		t.Run(tc.profile, func(t *testing.T) {
			slices := buildSlices(t, tc)
			validateSlices(t, slices)
			devices := 0
			for _, s := range slices {
				devices += len(s.Spec.Devices)
			}
			if devices == 0 {
				t.Fatal("no devices published")
			}
		})
	}
	// The 8-GPU MIG nodes need several slices of one pool.
	if n := len(buildSlices(t, nodeOpts{profile: "dgxh100", mig: true})); n < 4 {
		t.Errorf("dgxh100 MIG published %d slices, want the 200 devices split over several", n)
	}
}

func TestShippedClassesSelectExactlyTheirType(t *testing.T) {
	classes := shippedClasses(t)
	slices := append(buildSlices(t, nodeOpts{profile: "t4:2", timeSlices: 2}), buildSlices(t, nodeOpts{profile: "h100-80gb", mig: true})...)
	cache := cel.NewCache(10, cel.Features{})
	want := map[string]string{"gpu.tessera.dev": "gpu", "mig.tessera.dev": "mig", "timeslice.tessera.dev": "timeslice"}
	matched := map[string]int{}
	for _, dc := range classes {
		typ, ok := want[dc.Name]
		if !ok {
			t.Fatalf("unexpected class %s", dc.Name)
		}
		for _, s := range slices {
			for _, d := range s.Spec.Devices {
				all := true
				for _, sel := range dc.Spec.Selectors {
					expr := cache.GetOrCompile(sel.CEL.Expression)
					if expr.Error != nil {
						t.Fatalf("class %s: %v", dc.Name, expr.Error)
					}
					ok, _, err := expr.DeviceMatches(context.Background(), cel.Device{Driver: s.Spec.Driver, Attributes: d.Attributes, Capacity: d.Capacity, AllowMultipleAllocations: d.AllowMultipleAllocations})
					if err != nil {
						t.Fatal(err)
					}
					all = all && ok
				}
				isType := *d.Attributes["type"].StringValue == typ
				if all != isType {
					t.Errorf("class %s matches device %s (type %s): %v", dc.Name, d.Name, *d.Attributes["type"].StringValue, all)
				}
				if all {
					matched[dc.Name]++
				}
			}
		}
	}
	for name := range want {
		if matched[name] == 0 {
			t.Errorf("class %s matched no device", name)
		}
	}
	// Another driver's device with type gpu must not match.
	expr := cache.GetOrCompile(classes[0].Spec.Selectors[0].CEL.Expression)
	var gpu0 resourceapi.Device
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			if d.Name == "gpu-0" {
				gpu0 = d
			}
		}
	}
	ok, _, _ := expr.DeviceMatches(context.Background(), cel.Device{Driver: "gpu.nvidia.com", Attributes: gpu0.Attributes})
	if ok {
		t.Error("class gpu.tessera.dev matches another driver's device")
	}
}

func TestConfigErrorsNameTheFlag(t *testing.T) {
	inv := func() *inventory.Inventory {
		spec, _ := nvmlmock.ParseProfile("t4")
		srv, _ := nvmlmock.New(nvmlmock.Options{Spec: spec})
		inv, err := discover.Discover(context.Background(), srv)
		if err != nil {
			t.Fatal(err)
		}
		return inv
	}()
	for _, tc := range []struct {
		name string
		cfg  devicemodel.Config
		want string
	}{
		{"negative time slices", devicemodel.Config{TimeSlices: -1, MIGMode: devicemodel.MIGDynamic}, "--time-slices=-1 is out of range"},
		{"too many time slices", devicemodel.Config{TimeSlices: 33, MIGMode: devicemodel.MIGDynamic}, "--time-slices=33 is out of range"},
		{"per-GPU override out of range", devicemodel.Config{TimeSlicesPerGPU: map[string]int{"0": 99}, MIGMode: devicemodel.MIGDynamic}, "time slices for GPU 0 = 99"},
		{"reserve larger than GPU", devicemodel.Config{ReservedMemory: 16 << 30, MIGMode: devicemodel.MIGDynamic}, "--reserved-memory=16Gi is not smaller than GPU 0's memory"},
		{"reserve leaves too little", devicemodel.Config{ReservedMemory: 15300 << 20, MIGMode: devicemodel.MIGDynamic}, "less than the smallest share"},
		{"bad MIG mode", devicemodel.Config{MIGMode: "sometimes"}, `--mig-mode="sometimes" is not valid`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := devicemodel.Build(inv, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestStaticMIGPublishesExistingInstances(t *testing.T) {
	spec, _ := nvmlmock.ParseProfile("h100-80gb")
	srv, err := nvmlmock.New(nvmlmock.Options{Spec: spec, Seed: nodeName, MIGEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	dev := srv.Devices()[0]
	for _, p := range []struct{ profile, start, size int }{{nvml.GPU_INSTANCE_PROFILE_4_SLICE, 0, 4}, {nvml.GPU_INSTANCE_PROFILE_1_SLICE, 6, 1}} {
		info, _ := dev.GetGpuInstanceProfileInfo(p.profile)
		gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvmlPlacement(p.start, p.size)[0])
		if ret != 0 {
			t.Fatalf("create GI: %v", ret)
		}
		ciInfo, _ := gi.GetComputeInstanceProfileInfo(discover.CIProfileForSlices[int(info.SliceCount)], 0)
		if _, ret := gi.CreateComputeInstance(&ciInfo); ret != 0 {
			t.Fatalf("create CI: %v", ret)
		}
	}
	inv, err := discover.Discover(context.Background(), srv)
	if err != nil {
		t.Fatal(err)
	}
	slices, err := devicemodel.Build(inv, devicemodel.Config{ReservedMemory: devicemodel.DefaultReservedMemory, MIGMode: devicemodel.MIGStatic})
	if err != nil {
		t.Fatal(err)
	}
	rs := nodeslices.Objects(nodeName, slices)
	validateSlices(t, rs)
	var got []string
	for _, s := range rs {
		for _, d := range s.Spec.Devices {
			got = append(got, d.Name)
			if u := *d.Attributes["uuid"].StringValue; !strings.HasPrefix(u, "MIG-") {
				t.Errorf("device %s uuid %s, want the MIG UUID", d.Name, u)
			}
			if p := *d.Attributes["parentUUID"].StringValue; p != inv.GPUs[0].UUID {
				t.Errorf("device %s parentUUID %s", d.Name, p)
			}
		}
	}
	if strings.Join(got, ",") != "gpu-0-mig-4g40gb-0,gpu-0-mig-1g10gb-6" {
		t.Fatalf("static devices %v", got)
	}
}
