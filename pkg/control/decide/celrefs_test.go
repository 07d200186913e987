package decide

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/control/sliceintern"
)

func TestAnalyzeCEL(t *testing.T) {
	for _, tc := range []struct {
		expr        string
		fixed       bool
		attrs, caps []domainName
	}{
		{expr: `device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == "mig"`, fixed: true,
			attrs: []domainName{newDomainName("gpu.tessera.dev", "type")}},
		{expr: `device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("10Gi")) >= 0`, fixed: true,
			caps: []domainName{newDomainName("gpu.tessera.dev", "memory")}},
		{expr: `has(device.attributes["x.dev"].model) && device.attributes["x.dev"]["model"].startsWith("h")`, fixed: true,
			attrs: []domainName{newDomainName("x.dev", "model"), newDomainName("x.dev", "model")}},
		{expr: `device.attributes["x.dev"].?model.orValue("") == "h100" && device.allowMultipleAllocations`, fixed: true,
			attrs: []domainName{newDomainName("x.dev", "model")}},
		{expr: `[1, 2].exists(i, device.attributes["x.dev"].index == i)`, fixed: true,
			attrs: []domainName{newDomainName("x.dev", "index")}},
		// The device or its maps as a whole, or computed keys: everything.
		{expr: `"model" in device.attributes["x.dev"]`},
		{expr: `device.attributes.size() > 0`},
		{expr: `device.attributes["x" + ".dev"].model == "a"`},
		{expr: `device.attributes["x.dev"][device.driver] == "a"`},
		{expr: `device == {}`},
		{expr: `device.attributes["x.dev"].exists(k, k == "uuid")`},
		{expr: `this is not CEL (`},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			got := analyzeCEL(tc.expr)
			if got.fixed != tc.fixed || !equalRefs(got.attrs, tc.attrs) || !equalRefs(got.caps, tc.caps) {
				t.Errorf("analyzeCEL = %+v, want fixed=%v attrs=%v caps=%v", got, tc.fixed, tc.attrs, tc.caps)
			}
		})
	}
}

func equalRefs(a, b []domainName) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestCELRefsKeyDecides checks the premise of celRefs.key: devices with the
// same key get the same result from the expression, and devices that
// differ in what it reads get different keys.
func TestCELRefsKeyDecides(t *testing.T) {
	const driver = "gpu.tessera.dev"
	dev := func(typ, uuid string, mem string, bare bool) *resourceapi.Device {
		d := &resourceapi.Device{
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {StringValue: ptr.To(uuid)}},
			Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse(mem)}},
		}
		name := resourceapi.QualifiedName(driver + "/type")
		if bare {
			name = "type"
		}
		d.Attributes[name] = resourceapi.DeviceAttribute{StringValue: ptr.To(typ)}
		return d
	}
	devices := []*resourceapi.Device{
		dev("mig", "a", "10Gi", true), dev("mig", "b", "10Gi", false), dev("mig", "c", "20Gi", true),
		dev("gpu", "d", "80Gi", true), dev("gpu", "e", "80Gi", false),
	}
	cache := cel.NewCache(10, cel.Features{})
	for _, expr := range []string{
		`device.attributes["gpu.tessera.dev"].type == "mig"`,
		`device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("10Gi")) == 0`,
		`device.attributes["gpu.tessera.dev"].uuid == "a"`,
	} {
		refs := analyzeCEL(expr)
		results := map[string]bool{}
		for i, d := range devices {
			if !refs.fixed || !deviceConvertible(sliceintern.MapAttrs(d.Attributes), versionCache{}.ok) {
				t.Fatalf("%s: no key for device %d", expr, i)
			}
			k := string(refs.appendKey(nil, driver, d, sliceintern.MapAttrs(d.Attributes)))
			m, _, err := cache.GetOrCompile(expr).DeviceMatches(context.Background(), cel.Device{Driver: driver, Attributes: d.Attributes, Capacity: d.Capacity})
			if err != nil {
				t.Fatal(err)
			}
			if prev, seen := results[k]; seen && prev != m {
				t.Errorf("%s: devices with key %q disagree", expr, k)
			}
			results[k] = m
		}
		if len(results) < 2 {
			t.Errorf("%s: one key for all devices, although they differ in what it reads", expr)
		}
	}
	// A version that does not parse fails every expression on the device:
	// the whole content decides.
	for v, want := range map[string]bool{"580.65.6": true, "not-a-version": false} {
		d := &resourceapi.Device{Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"driverVersion": {VersionValue: ptr.To(v)}}}
		if ok := deviceConvertible(sliceintern.MapAttrs(d.Attributes), versionCache{}.ok); ok != want {
			t.Errorf("version %q: convertible = %v, want %v", v, ok, want)
		}
	}
}
