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
		for _, s := range slices {
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
				if !apiequality.Semantic.DeepEqual(got, want[i]) {
					t.Fatalf("slice %s changed: got %+v, want %+v", s.Name, got, want[i])
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
					if ua, ub := a[j].Attributes["productName"].StringValue, b[j].Attributes["productName"].StringValue; ua != ub {
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
	return float64(after-before) / float64(devices)
}

// The transform cuts what the cache holds per device of nodes in dynamic
// MIG mode (the scale run's (m) workload) by at least a quarter (it cuts
// about 37%: what stays is each device's attribute map, docs/controller.md).
func TestTransformCutsMemoryPerDevice(t *testing.T) {
	o := decidetest.NodeOptions{Profile: "dgxh100", MIG: true}
	decoded := retainedPerDevice(t, 20, o, nil)
	interned := retainedPerDevice(t, 20, o, sliceintern.New(0, nil))
	t.Logf("per dynamic-MIG device: decoded %.0f B, interned %.0f B", decoded, interned)
	if interned > 0.75*decoded {
		t.Fatalf("interned slices hold %.0f B per device, decoded %.0f B: want at most 0.75x", interned, decoded)
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
