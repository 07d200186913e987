package sliceintern_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"runtime"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/sliceintern"
	"github.com/tessera-dev/tessera/test/testutil"
)

// published returns what an informer decodes for n nodes' slices: every
// object decoded from its own JSON, sharing nothing, with managed fields
// as the API server sets them.
func published(t testing.TB, n int, o decidetest.NodeOptions) []*resourceapi.ResourceSlice {
	t.Helper()
	var out []*resourceapi.ResourceSlice
	for i := range n {
		slices, err := decidetest.NodeSlices(fmt.Sprintf("node-%04d", i), o)
		if err != nil {
			t.Fatal(err)
		}
		for j, s := range slices {
			s.UID, s.ResourceVersion = types.UID(fmt.Sprintf("uid-%04d-%d", i, j)), "1"
			s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet-plugin", Operation: metav1.ManagedFieldsOperationUpdate, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:spec":{"f:devices":{}}}`)}}
			raw, err := json.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			var d resourceapi.ResourceSlice
			if err := json.Unmarshal(raw, &d); err != nil {
				t.Fatal(err)
			}
			out = append(out, &d)
		}
	}
	return out
}

func mapID(m any) uintptr { return reflect.ValueOf(m).Pointer() }

func TestSliceKeepsContentAndShares(t *testing.T) {
	for _, o := range []decidetest.NodeOptions{
		{Profile: "dgxh100", MIG: true},
		{Profile: "dgxh100", TimeSlices: 4},
		{Profile: "t4:3,a100-40gb"},
	} {
		t.Run(fmt.Sprintf("%+v", o), func(t *testing.T) {
			slices := published(t, 2, o)
			want := make([]*resourceapi.ResourceSlice, len(slices))
			for i, s := range slices {
				want[i] = s.DeepCopy()
				want[i].ManagedFields = nil
			}
			in := sliceintern.New(0, nil)
			for i, s := range slices {
				got, err := in.Transform()(s)
				if err != nil {
					t.Fatal(err)
				}
				if full := in.WithAttributes(got.(*resourceapi.ResourceSlice)); !apiequality.Semantic.DeepEqual(full, want[i]) {
					t.Fatalf("slice %s changed: got %+v, want %+v", s.Name, full, want[i])
				}
				for j, d := range s.Spec.Devices {
					if d.Attributes != nil {
						t.Fatalf("device %s: the cached object keeps its attribute map", d.Name)
					}
					if a := in.Attributes(s, j); a.Len() != len(want[i].Spec.Devices[j].Attributes) {
						t.Fatalf("device %s: %d attributes, want %d", d.Name, a.Len(), len(want[i].Spec.Devices[j].Attributes))
					}
				}
			}
			// The two nodes publish the same devices: every capacity map
			// and counter consumption of the second is the first's.
			half := len(slices) / 2
			for i := range half {
				a, b := slices[i].Spec.Devices, slices[half+i].Spec.Devices
				for j := range a {
					if len(a[j].Capacity) > 0 && mapID(a[j].Capacity) != mapID(b[j].Capacity) {
						t.Errorf("device %s: capacity not shared between the nodes", a[j].Name)
					}
					if len(a[j].ConsumesCounters) > 0 && &a[j].ConsumesCounters[0] != &b[j].ConsumesCounters[0] {
						t.Errorf("device %s: counter consumption not shared between the nodes", a[j].Name)
					}
					pa, _ := in.Attributes(slices[i], j).Get("productName")
					pb, _ := in.Attributes(slices[half+i], j).Get("productName")
					if pa.StringValue == nil || pa.StringValue != pb.StringValue {
						t.Errorf("device %s: productName not shared", a[j].Name)
					}
				}
			}
		})
	}
}

// A reader that changes a cached slice copies it first; the copy's maps
// are its own, so the change reaches no other device.
func TestDeepCopyOwnsItsMaps(t *testing.T) {
	slices := published(t, 2, decidetest.NodeOptions{Profile: "h100-80gb:2"})
	in := sliceintern.New(0, nil)
	for _, s := range slices {
		in.Slice(s)
	}
	c := slices[0].DeepCopy()
	for k := range c.Spec.Devices[0].Capacity {
		c.Spec.Devices[0].Capacity[k] = resourceapi.DeviceCapacity{Value: resource.MustParse("1")}
	}
	if apiequality.Semantic.DeepEqual(c.Spec.Devices[0].Capacity, slices[1].Spec.Devices[0].Capacity) {
		t.Fatal("changing a copy changed the shared capacity")
	}
}

// What no slice brought for two periods is forgotten (and freed once no
// stored slice uses it); what slices keep bringing stays.
func TestForgetsAfterTwoPeriods(t *testing.T) {
	now := time.Unix(0, 0)
	in := sliceintern.New(time.Minute, func() time.Time { return now })
	s := published(t, 1, decidetest.NodeOptions{Profile: "h100-80gb:1"})
	in.Slice(s[0].DeepCopy())
	n := in.Len()
	if n == 0 {
		t.Fatal("nothing remembered")
	}
	// A period passes; a slice arrives: the rotation keeps what it asks for.
	now = now.Add(time.Minute)
	in.Slice(s[0].DeepCopy())
	if got := in.Len(); got != n {
		t.Fatalf("after one period with the same slice: %d parts, want %d", got, n)
	}
	// Two periods pass; a slice of another model arrives: the first
	// model's parts are forgotten.
	other := published(t, 1, decidetest.NodeOptions{Profile: "t4:1"})
	now = now.Add(time.Minute)
	in.Slice(other[0].DeepCopy())
	now = now.Add(time.Minute)
	in.Slice(other[0].DeepCopy())
	fresh := sliceintern.New(time.Minute, nil)
	fresh.Slice(other[0].DeepCopy())
	if got, want := in.Len(), fresh.Len(); got != want {
		t.Fatalf("after two periods without the first model: %d parts, want the second model's %d", got, want)
	}
}

// retainedPerDevice is the heap the slices of nodes hold per device once
// decoded (and transformed by in, when not nil).
func retainedPerDevice(t testing.TB, nodes int, o decidetest.NodeOptions, in *sliceintern.Interner) float64 {
	var raw [][]byte
	for _, s := range published(t, nodes, o) {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		raw = append(raw, b)
	}
	before := testutil.LiveHeap()
	slices := make([]*resourceapi.ResourceSlice, 0, len(raw))
	devices := 0
	for _, b := range raw {
		s := &resourceapi.ResourceSlice{}
		if err := json.Unmarshal(b, s); err != nil {
			t.Fatal(err)
		}
		if in != nil {
			if _, err := in.Transform()(s); err != nil {
				t.Fatal(err)
			}
		}
		devices += len(s.Spec.Devices)
		slices = append(slices, s)
	}
	after := testutil.LiveHeap()
	runtime.KeepAlive(slices)
	runtime.KeepAlive(raw) // not freed while measured
	runtime.KeepAlive(in)
	return (float64(after) - float64(before)) / float64(devices)
}

// The transform cuts what the cache holds per device of nodes in dynamic
// MIG mode (the scale run's (m) workload) to at most 512 bytes, a tenth of
// the decoded form (about 345 B against 7.7 KiB: docs/benchmarks.md).
func TestTransformCutsMemoryPerDevice(t *testing.T) {
	o := decidetest.NodeOptions{Profile: "dgxh100", MIG: true}
	decoded := retainedPerDevice(t, 20, o, nil)
	interned := retainedPerDevice(t, 20, o, sliceintern.New(0, nil))
	t.Logf("per dynamic-MIG device: decoded %.0f B, interned %.0f B", decoded, interned)
	if interned > 512 || interned > 0.1*decoded {
		t.Fatalf("interned slices hold %.0f B per device, decoded %.0f B: want at most 512 B and 0.1x", interned, decoded)
	}
}

// BenchmarkRetainedPerDevice measures the heap the cached slices of 100
// dynamic-MIG 8 x H100 nodes hold per device, as decoded and as the
// controller's cache keeps them.
func BenchmarkRetainedPerDevice(b *testing.B) {
	o := decidetest.NodeOptions{Profile: "dgxh100", MIG: true}
	for _, c := range []struct {
		name   string
		intern bool
	}{{"decoded", false}, {"interned", true}} {
		b.Run(c.name, func(b *testing.B) {
			var per float64
			for b.Loop() {
				var in *sliceintern.Interner
				if c.intern {
					in = sliceintern.New(0, nil)
				}
				per = retainedPerDevice(b, 100, o, in)
			}
			b.ReportMetric(per, "B/device")
		})
	}
}

// Every copy of a cached slice (a struct copy, as a cache list without deep
// copies makes; a deep copy) reads the same attributes, and the API's form
// made from them is what was published.
func TestAttributesOfCopies(t *testing.T) {
	slices := published(t, 1, decidetest.NodeOptions{Profile: "dgxh100", MIG: true})
	want := slices[1].DeepCopy()
	in := sliceintern.New(0, nil)
	for _, s := range slices {
		if _, err := in.Transform()(s); err != nil {
			t.Fatal(err)
		}
	}
	s := slices[1]
	// An informer may transform an object again: nothing changes.
	if _, err := in.Transform()(s); err != nil {
		t.Fatal(err)
	}
	shallow := *s
	for name, c := range map[string]*resourceapi.ResourceSlice{"stored": s, "struct copy": &shallow, "deep copy": s.DeepCopy()} {
		for j, d := range want.Spec.Devices {
			a := in.Attributes(c, j)
			if a.Len() != len(d.Attributes) {
				t.Fatalf("%s, device %s: %d attributes, want %d", name, d.Name, a.Len(), len(d.Attributes))
			}
			for n, v := range d.Attributes {
				if got, ok := a.Get(n); !ok || !apiequality.Semantic.DeepEqual(got, v) {
					t.Fatalf("%s, device %s: attribute %s = %+v (%v), want %+v", name, d.Name, n, got, ok, v)
				}
			}
			if _, ok := a.Get("no-such-attribute"); ok {
				t.Fatalf("%s, device %s: an attribute it does not have", name, d.Name)
			}
			if !apiequality.Semantic.DeepEqual(a.Map(), d.Attributes) {
				t.Fatalf("%s, device %s: Map() differs from what was published", name, d.Name)
			}
		}
	}
	sub := in.Subset(s, []int{3, 1})
	if len(sub.Spec.Devices) != 2 || sub.Spec.Devices[0].Name != want.Spec.Devices[3].Name || sub.Spec.Devices[1].Name != want.Spec.Devices[1].Name ||
		!apiequality.Semantic.DeepEqual(sub.Spec.Devices[0].Attributes, want.Spec.Devices[3].Attributes) {
		t.Fatalf("Subset(3, 1) = %+v", sub.Spec.Devices)
	}
	if s.Spec.Devices[3].Attributes != nil || len(s.Spec.Devices) != len(want.Spec.Devices) {
		t.Fatal("Subset changed the stored slice")
	}
	// A slice read from the API (no compact form) is its own.
	if got := in.WithAttributes(want); got != want {
		t.Fatal("WithAttributes copied a slice that carries its attributes")
	}
	var none *sliceintern.Interner
	if a := none.Attributes(want, 0); !apiequality.Semantic.DeepEqual(a.Map(), want.Spec.Devices[0].Attributes) {
		t.Fatal("a nil interner does not read the device's own attributes")
	}
}

// A slice that is not a stored object (no UID or resourceVersion) keeps
// its attribute maps, their values shared.
func TestTransformKeepsMapsOfUnstoredSlices(t *testing.T) {
	slices := published(t, 2, decidetest.NodeOptions{Profile: "h100-80gb:1"})
	in := sliceintern.New(0, nil)
	for _, s := range slices {
		s.UID, s.ResourceVersion = "", ""
		if _, err := in.Transform()(s); err != nil {
			t.Fatal(err)
		}
	}
	a, b := slices[0].Spec.Devices[0].Attributes["productName"], slices[len(slices)/2].Spec.Devices[0].Attributes["productName"]
	if a.StringValue == nil || a.StringValue != b.StringValue {
		t.Fatalf("productName %v and %v: kept, but not shared", a.StringValue, b.StringValue)
	}
	if in.CompactSlices() != 0 {
		t.Fatalf("%d slices in compact form, want none", in.CompactSlices())
	}
}

// The compact form of a slice lives as long as the cached object: once the
// cache dropped it (replaced by a newer version, or deleted) and nobody
// holds it, its entry goes. An entry a later object of the same version
// made (a relist) stays while that object lives.
func TestCompactFormGoesWithTheObject(t *testing.T) {
	in := sliceintern.New(0, nil)
	// Node 0's slice twice (the same UID and resourceVersion), node 1's once.
	transform := func(node int) *resourceapi.ResourceSlice {
		all := published(t, 2, decidetest.NodeOptions{Profile: "h100-80gb:1"})
		s := all[node*len(all)/2]
		if _, err := in.Transform()(s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	transform(0)             // an object a relist replaced: nothing holds it
	relisted := transform(0) // the object the cache holds now
	transform(1)             // a deleted slice: nothing holds it
	if n := in.CompactSlices(); n != 2 {
		t.Fatalf("%d entries, want 2", n)
	}
	waitFor := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for in.CompactSlices() != want && time.Now().Before(deadline) {
			runtime.GC()
			time.Sleep(10 * time.Millisecond)
		}
		if n := in.CompactSlices(); n != want {
			t.Fatalf("%d entries, want %d", n, want)
		}
	}
	waitFor(1) // node 1's entry goes, node 0's stays
	if a := in.Attributes(relisted, 0); a.Len() == 0 {
		t.Fatal("dropping an older object of the version removed the entry of the one the cache holds")
	}
	waitFor(0) // relisted is not used beyond this point
}
