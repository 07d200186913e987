package decide

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

// TestShortcutsPlaceAsExact runs the same random sequences of allocations
// and releases (MIG prioritized lists, memory shares, whole GPUs with
// selectors, pods with two claims) on MIG nodes through a placer with the
// shortcuts and one without (ExactPlacement), and requires the very same
// allocation results, device by device, at every step.
//
// It runs for every feature set the controller's allocator can have
// (--kubernetes-version or the API server's version, and
// --scheduler-feature-gates), since the shortcuts lean on how the
// allocator behaves under them: the defaults of 1.34 to 1.37, and 1.34
// and 1.35 with the three gates docs/compatibility.md asks for. With the
// defaults of 1.34 and 1.35 nothing Tessera publishes can be allocated
// (the test checks that too); every other set must exercise the shortcuts.
func TestShortcutsPlaceAsExact(t *testing.T) {
	for minor := allocation.OldestSupported; minor <= allocation.NewestKnown; minor++ {
		version := fmt.Sprintf("v1.%d.0", minor)
		defaults, err := allocation.FeaturesFor(version)
		if err != nil {
			t.Fatal(err)
		}
		usable := decidetest.Usable(defaults)
		t.Run(version, func(t *testing.T) { shortcutsPlaceAsExact(t, defaults, usable) })
		if !usable {
			withGates, err := allocation.Override(defaults, decidetest.Gates)
			if err != nil {
				t.Fatal(err)
			}
			t.Run(version+"+gates", func(t *testing.T) { shortcutsPlaceAsExact(t, withGates, true) })
		}
	}
}

// shortcutsPlaceAsExact is TestShortcutsPlaceAsExact for one feature set.
// usable: Tessera's devices can be allocated under it, and the sequences
// must exercise every shortcut; else nothing may be placed.
func shortcutsPlaceAsExact(t *testing.T, features structured.Features, usable bool) {
	var nodes []*corev1.Node
	var all []*resourceapi.ResourceSlice
	for i, o := range []decidetest.NodeOptions{{Profile: "h100-80gb:2", MIG: true}, {Profile: "a100-40gb:2", MIG: true}, {Profile: "l4:2", TimeSlices: 3}} {
		name := fmt.Sprintf("n%d", i)
		s, err := decidetest.NodeSlices(name, o)
		if err != nil {
			t.Fatal(err)
		}
		nodes, all = append(nodes, decidetest.Node(name)), append(all, s...)
	}
	sizes := migSizes(all)
	if len(sizes) < 3 {
		t.Fatalf("MIG sizes %v: the nodes publish no MIG devices", sizes)
	}
	var placed, failed, shared, stripped, confirmed int
	for seed := range uint64(12) {
		rng := rand.New(rand.NewPCG(seed, 7))
		ctx := context.Background()
		fast := newPlacer(nodes, all, nil, decidetest.Classes(), features, cel.NewCache(100, cel.Features{}), false, nil)
		exact := newPlacer(nodes, all, nil, decidetest.Classes(), features, cel.NewCache(100, cel.Features{}), true, nil)
		// Each placer releases its own results: the share IDs differ.
		type held struct {
			node        int
			fast, exact []resourceapi.AllocationResult
		}
		var holds []held
		for step := range 150 {
			if len(holds) > 0 && rng.IntN(4) == 0 {
				i := rng.IntN(len(holds))
				h := holds[i]
				for j := range h.fast {
					fast.remove(fast.nodes[h.node], &h.fast[j])
					exact.remove(exact.nodes[h.node], &h.exact[j])
				}
				holds = slices.Delete(holds, i, i+1)
				continue
			}
			claims := []*resourceapi.ResourceClaim{randomClaim(rng, sizes, seed, step, 0)}
			if rng.IntN(6) == 0 {
				claims = append(claims, randomClaim(rng, sizes, seed, step, 1))
			}
			for n := range fast.nodes {
				got, gotErr := fast.allocate(ctx, fast.nodes[n], claims)
				want, wantErr := exact.allocate(ctx, exact.nodes[n], claims)
				if (gotErr != nil) != (wantErr != nil) {
					t.Fatalf("seed %d step %d node %d: error %v with shortcuts, %v without", seed, step, n, gotErr, wantErr)
				}
				if !reflect.DeepEqual(withoutShareIDs(got), withoutShareIDs(want)) {
					t.Fatalf("seed %d step %d node %d: claims %s\nwith shortcuts: %+v\nwithout:        %+v", seed, step, n, claimsString(claims), got, want)
				}
				if got == nil {
					failed++
					continue
				}
				placed++
				for j := range got {
					fast.add(fast.nodes[n], &got[j])
					exact.add(exact.nodes[n], &want[j])
				}
				holds = append(holds, held{n, got, want})
				break
			}
		}
		shared += fast.sharedFailures
		stripped += fast.strippedCalls
		confirmed += fast.strippedConfirmed
		if fast.strippedMismatches != 0 {
			t.Errorf("seed %d: %d allocator calls without selectors chose a device the exact call did not confirm", seed, fast.strippedMismatches)
		}
		if exact.sharedFailures != 0 {
			t.Errorf("seed %d: ExactPlacement shared %d failures", seed, exact.sharedFailures)
		}
	}
	t.Logf("placed %d, failed %d, shared failures %d, calls without selectors %d (confirmed for config: %d)", placed, failed, shared, stripped, confirmed)
	// The sequences must exercise both outcomes, the shared failures and
	// the calls without selectors.
	if !usable {
		if placed != 0 {
			t.Errorf("placed %d claims with features under which Tessera's devices cannot be allocated", placed)
		}
		return
	}
	if placed < 100 || failed < 100 || shared < 50 || stripped < 100 || confirmed < 20 {
		t.Errorf("placed %d, failed %d, shared failures %d, calls without selectors %d (confirmed %d): the sequences do not exercise the shortcuts", placed, failed, shared, stripped, confirmed)
	}
}

func migSizes(published []*resourceapi.ResourceSlice) []int64 {
	var out []int64
	for _, s := range published {
		for _, d := range s.Spec.Devices {
			if a := d.Attributes[devicemodel.AttrType]; a.StringValue != nil && *a.StringValue == devicemodel.TypeMIG {
				if c := d.Capacity[devicemodel.CapMemory]; !slices.Contains(out, c.Value.Value()) {
					out = append(out, c.Value.Value())
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

func memSelector(op string, b int64) resourceapi.DeviceSelector {
	return resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf(
		`device.capacity["gpu.tessera.dev"].memory.compareTo(quantity(%q)) %s 0`, resource.NewQuantity(b, resource.BinarySI).String(), op)}}
}

// randomClaim is a MIG prioritized list (the smallest partition that
// holds the request first, a share last), a memory share, a whole GPU
// with at least some memory, or a time slice (which shares its GPU's
// counters with the whole GPU and its shares).
func randomClaim(rng *rand.Rand, sizes []int64, seed uint64, step, i int) *resourceapi.ResourceClaim {
	mem := int64(1+rng.IntN(160)) << 28 // 256Mi .. 40Gi
	share := &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{devicemodel.CapMemory: *resource.NewQuantity(mem, resource.BinarySI)}}
	req := resourceapi.DeviceRequest{Name: "gpu"}
	switch rng.IntN(4) {
	case 0:
		for _, s := range sizes {
			if s < mem {
				continue
			}
			req.FirstAvailable = append(req.FirstAvailable, resourceapi.DeviceSubRequest{
				Name: fmt.Sprintf("mig-%d", len(req.FirstAvailable)), DeviceClassName: "mig.tessera.dev",
				Selectors: []resourceapi.DeviceSelector{memSelector("==", s)}, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			})
		}
		req.FirstAvailable = append(req.FirstAvailable, resourceapi.DeviceSubRequest{
			Name: "share", DeviceClassName: "gpu.tessera.dev", Capacity: share, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		})
	case 1:
		req.Exactly = &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev", Capacity: share, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
	case 2:
		// With a capacity request, so that the whole GPU (which shares the
		// time slices' counters and allows several allocations) could take
		// it, were it not for the class.
		req.Exactly = &resourceapi.ExactDeviceRequest{DeviceClassName: "timeslice.tessera.dev", Capacity: share, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
	default:
		req.Exactly = &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev", Selectors: []resourceapi.DeviceSelector{memSelector(">=", mem)}, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
	}
	name := fmt.Sprintf("c-%d-%d-%d", seed, step, i)
	cl := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name)},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}},
	}
	if rng.IntN(3) == 0 {
		// Config for the request (and, in a prioritized list, for its
		// first subrequest): the allocator copies it into the result.
		requests := []string{req.Name}
		if len(req.FirstAvailable) > 0 {
			requests = append(requests, req.Name+"/"+req.FirstAvailable[0].Name)
		}
		cl.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "gpu.tessera.dev", Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig"}`)}},
		}}}
	}
	return cl
}

func claimsString(claims []*resourceapi.ResourceClaim) string {
	s := ""
	for _, c := range claims {
		s += fmt.Sprintf("%+v ", c.Spec.Devices)
	}
	return s
}

// withoutShareIDs drops the share IDs, which the allocator draws at random.
func withoutShareIDs(res []resourceapi.AllocationResult) []resourceapi.AllocationResult {
	if res == nil {
		return nil
	}
	out := make([]resourceapi.AllocationResult, len(res))
	for i := range res {
		res[i].DeepCopyInto(&out[i])
		for j := range out[i].Devices.Results {
			if out[i].Devices.Results[j].ShareID == nil {
				continue
			}
			out[i].Devices.Results[j].ShareID = ptrTo(types.UID("share"))
		}
	}
	return out
}

func ptrTo[T any](v T) *T { return &v }

// TestPlaceCacheBounded: an engine drops what it kept across cycles once
// it holds more than maxCached device keys or index entries.
func TestPlaceCacheBounded(t *testing.T) {
	e := NewEngine(DefaultConfig())
	snap := &Snapshot{Classes: decidetest.Classes()}
	if _, err := e.Decide(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	kept := e.places
	if _, err := e.Decide(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	if e.places != kept {
		t.Fatal("the engine dropped its cache with nothing changed")
	}
	kept.entries = maxCached + 1
	if _, err := e.Decide(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	if e.places == kept {
		t.Fatalf("the engine kept a cache of %d entries (bound %d)", kept.entries, maxCached)
	}
}
