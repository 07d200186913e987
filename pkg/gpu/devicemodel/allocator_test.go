package devicemodel_test

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/deployments"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/discover"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/gpu/nodeslices"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
	"github.com/tessera-dev/tessera/pkg/node/enforce"
)

const nodeName = "node-1"

// shippedClasses loads the DeviceClasses users install.
func shippedClasses(t testing.TB) allocation.Classes {
	t.Helper()
	classes, err := deployments.DeviceClasses()
	if err != nil {
		t.Fatal(err)
	}
	if len(classes) != 3 {
		t.Fatalf("want 3 shipped DeviceClasses, got %d", len(classes))
	}
	return classes
}

type nodeOpts struct {
	profile    string
	mig        bool
	timeSlices int
	reserved   uint64
	maxShares  int
}

// buildSlices publishes a mock node exactly as the plugin does.
func buildSlices(t testing.TB, o nodeOpts) []*resourceapi.ResourceSlice {
	t.Helper()
	spec, err := nvmlmock.ParseProfile(o.profile)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := nvmlmock.New(nvmlmock.Options{Spec: spec, Seed: nodeName, MIGEnabled: o.mig})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := discover.Discover(context.Background(), srv)
	if err != nil {
		t.Fatal(err)
	}
	reserved := o.reserved
	if reserved == 0 {
		reserved = devicemodel.DefaultReservedMemory
	}
	slices, err := devicemodel.Build(inv, devicemodel.Config{ReservedMemory: reserved, TimeSlices: o.timeSlices, MaxSharesPerGPU: o.maxShares, MIGMode: devicemodel.MIGDynamic})
	if err != nil {
		t.Fatal(err)
	}
	return nodeslices.Objects(nodeName, slices)
}

type req struct {
	class    string
	memory   string // capacity.requests.memory; "" = none
	cores    string
	shares   string // capacity.requests.shares; "" = none
	selector string // extra CEL
}

var claimSeq int

func newClaim(r req) *resourceapi.ResourceClaim {
	claimSeq++
	exact := &resourceapi.ExactDeviceRequest{DeviceClassName: r.class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
	if r.memory != "" || r.cores != "" || r.shares != "" {
		exact.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		if r.memory != "" {
			exact.Capacity.Requests["memory"] = resource.MustParse(r.memory)
		}
		if r.cores != "" {
			exact.Capacity.Requests["cores"] = resource.MustParse(r.cores)
		}
		if r.shares != "" {
			exact.Capacity.Requests["shares"] = resource.MustParse(r.shares)
		}
	}
	if r.selector != "" {
		exact.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: r.selector}}}
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", claimSeq), Namespace: "default", UID: types.UID(fmt.Sprintf("uid-%d", claimSeq))},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: exact}},
		}},
	}
}

func migReq(profile string) req {
	return req{class: "mig.tessera.dev", selector: fmt.Sprintf(`device.attributes["gpu.tessera.dev"].migProfile == %q`, profile)}
}

// cluster allocates claims one after another, as the scheduler does for
// successive pods, and remembers the results.
type cluster struct {
	t       testing.TB
	alloc   *allocation.Allocator
	state   *allocation.State
	results []resourceapi.AllocationResult
}

func newCluster(t testing.TB, o nodeOpts) *cluster {
	return &cluster{t: t, alloc: allocation.NewAllocator(buildSlices(t, o), shippedClasses(t)), state: allocation.NewState()}
}

// place allocates one claim; it reports whether it fit and on which device.
func (c *cluster) place(r req) (string, bool) {
	c.t.Helper()
	res, err := c.alloc.Allocate(context.Background(), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, c.state, newClaim(r))
	if err != nil {
		c.t.Fatalf("allocate %+v: %v", r, err)
	}
	if res == nil {
		return "", false
	}
	c.state.Add(&res[0])
	c.results = append(c.results, res[0])
	return res[0].Devices.Results[0].Device, true
}

func (c *cluster) mustPlace(r req) string {
	c.t.Helper()
	dev, ok := c.place(r)
	if !ok {
		c.t.Fatalf("claim %+v does not fit, want it to fit (placed so far: %v)", r, c.devices())
	}
	return dev
}

func (c *cluster) mustNotPlace(r req) {
	c.t.Helper()
	if dev, ok := c.place(r); ok {
		c.t.Fatalf("claim %+v fit on %s, want it not to fit (placed before: %v)", r, dev, c.devices())
	}
}

func (c *cluster) devices() []string {
	var out []string
	for _, r := range c.results {
		out = append(out, r.Devices.Results[0].Device)
	}
	return out
}

func TestT4Shares(t *testing.T) {
	share := func(m string) req { return req{class: "gpu.tessera.dev", memory: m} }
	whole := req{class: "gpu.tessera.dev"}

	t.Run("four quarter shares fit one T4, a fifth does not", func(t *testing.T) {
		c := newCluster(t, nodeOpts{profile: "t4"})
		for range 4 {
			if dev := c.mustPlace(share("3776Mi")); dev != "gpu-0" {
				t.Fatalf("share landed on %s", dev)
			}
		}
		c.mustNotPlace(share("3776Mi"))
	})
	t.Run("scheduler showdown mix lands on one T4 with the default reserve", func(t *testing.T) {
		c := newCluster(t, nodeOpts{profile: "t4:2"})
		for _, m := range []string{"2000Mi", "2000Mi", "8000Mi", "3000Mi"} {
			if dev := c.mustPlace(share(m)); dev != "gpu-0" {
				t.Fatalf("share %s landed on %s, want all four packed on gpu-0", m, dev)
			}
		}
		var total resource.Quantity
		for _, r := range c.results {
			total.Add(r.Devices.Results[0].ConsumedCapacity["memory"])
		}
		if got := total.Value(); got != 15000<<20 {
			t.Fatalf("consumed memory %d, want exactly the requested 15000Mi", got)
		}
	})
	t.Run("exclusive takes the whole GPU, then no share fits on it", func(t *testing.T) {
		c := newCluster(t, nodeOpts{profile: "t4"})
		c.mustPlace(whole)
		c.mustNotPlace(share("256Mi"))
		c.mustNotPlace(whole)
	})
	t.Run("a share blocks an exclusive request on the same GPU", func(t *testing.T) {
		c := newCluster(t, nodeOpts{profile: "t4:2"})
		if dev := c.mustPlace(share("1Gi")); dev != "gpu-0" {
			t.Fatalf("share on %s", dev)
		}
		if dev := c.mustPlace(whole); dev != "gpu-1" {
			t.Fatalf("exclusive request landed on %s, want gpu-1", dev)
		}
		c.mustNotPlace(whole)
	})
	t.Run("share larger than usable memory does not fit", func(t *testing.T) {
		c := newCluster(t, nodeOpts{profile: "t4"})
		c.mustNotPlace(share("15Gi"))
	})
	t.Run("small shares are rounded up to the minimum", func(t *testing.T) {
		c := newCluster(t, nodeOpts{profile: "t4"})
		c.mustPlace(share("10Mi"))
		got := c.results[0].Devices.Results[0].ConsumedCapacity["memory"]
		if got.Value() != devicemodel.MinShareMemory {
			t.Fatalf("consumed %s, want the 256Mi minimum", got.String())
		}
	})
	t.Run("compute shares add up to 100 percent", func(t *testing.T) {
		c := newCluster(t, nodeOpts{profile: "t4"})
		c.mustPlace(req{class: "gpu.tessera.dev", memory: "1Gi", cores: "60"})
		c.mustNotPlace(req{class: "gpu.tessera.dev", memory: "1Gi", cores: "50"})
		c.mustPlace(req{class: "gpu.tessera.dev", memory: "1Gi", cores: "40"})
	})
}

// TestMaxSharesPerGPU checks --max-shares-per-gpu against the upstream
// allocator: the `shares` capacity's default of 1 is consumed by every
// allocation that does not name it.
func TestMaxSharesPerGPU(t *testing.T) {
	share := func(m string) req { return req{class: "gpu.tessera.dev", memory: m} }
	t.Run("N shares fit one GPU, the N+1th goes to the next GPU, then nowhere", func(t *testing.T) {
		c := newCluster(t, nodeOpts{profile: "t4:2", maxShares: 3})
		for range 3 {
			if dev := c.mustPlace(share("1Gi")); dev != "gpu-0" {
				t.Fatalf("share landed on %s, want gpu-0", dev)
			}
		}
		// Memory is left on gpu-0 (3Gi of ~14.75Gi), but its shares are not.
		for range 3 {
			if dev := c.mustPlace(share("1Gi")); dev != "gpu-1" {
				t.Fatalf("share landed on %s, want gpu-1 (gpu-0 is at its cap)", dev)
			}
		}
		c.mustNotPlace(share("256Mi"))
		got := c.results[0].Devices.Results[0].ConsumedCapacity[devicemodel.CapShares]
		if got.Value() != 1 {
			t.Fatalf("a share consumed %s shares, want 1", got.String())
		}
	})
	t.Run("a whole-GPU claim still fits and blocks shares", func(t *testing.T) {
		c := newCluster(t, nodeOpts{profile: "t4", maxShares: 2})
		c.mustPlace(req{class: "gpu.tessera.dev"})
		c.mustNotPlace(share("256Mi"))
	})
	t.Run("a cap of one is exclusive per GPU even for small shares", func(t *testing.T) {
		c := newCluster(t, nodeOpts{profile: "t4", maxShares: 1})
		c.mustPlace(share("256Mi"))
		c.mustNotPlace(share("256Mi"))
	})
	t.Run("asking for zero shares is rounded up to one, more than N never fits", func(t *testing.T) {
		c := newCluster(t, nodeOpts{profile: "t4", maxShares: 2})
		c.mustNotPlace(req{class: "gpu.tessera.dev", memory: "1Gi", shares: "3"})
		c.mustPlace(req{class: "gpu.tessera.dev", memory: "1Gi", shares: "0"})
		c.mustPlace(req{class: "gpu.tessera.dev", memory: "1Gi", shares: "1"})
		c.mustNotPlace(req{class: "gpu.tessera.dev", memory: "1Gi", shares: "0"})
	})
	t.Run("no cap publishes no shares capacity", func(t *testing.T) {
		c := newCluster(t, nodeOpts{profile: "t4"})
		for range 20 {
			c.mustPlace(share("256Mi"))
		}
		if _, ok := c.results[0].Devices.Results[0].ConsumedCapacity[devicemodel.CapShares]; ok {
			t.Fatal("shares consumed without a cap")
		}
	})
}

func TestTimeSlices(t *testing.T) {
	ts := req{class: "timeslice.tessera.dev"}
	t.Run("N=4: four partitions allocate, a fifth and a share do not", func(t *testing.T) {
		c := newCluster(t, nodeOpts{profile: "t4", timeSlices: 4})
		seen := map[string]bool{}
		for range 4 {
			seen[c.mustPlace(ts)] = true
		}
		if len(seen) != 4 {
			t.Fatalf("want 4 distinct partitions, got %v", c.devices())
		}
		c.mustNotPlace(ts)
		c.mustNotPlace(req{class: "gpu.tessera.dev", memory: "256Mi"})
		c.mustNotPlace(req{class: "gpu.tessera.dev"})
	})
	t.Run("a share on the GPU blocks every partition", func(t *testing.T) {
		c := newCluster(t, nodeOpts{profile: "t4", timeSlices: 4})
		c.mustPlace(req{class: "gpu.tessera.dev", memory: "1Gi"})
		c.mustPlace(req{class: "gpu.tessera.dev", memory: "1Gi"})
		c.mustNotPlace(ts)
	})
	t.Run("a whole GPU blocks every partition", func(t *testing.T) {
		c := newCluster(t, nodeOpts{profile: "t4", timeSlices: 2})
		c.mustPlace(req{class: "gpu.tessera.dev"})
		c.mustNotPlace(ts)
	})
	t.Run("partitions on one GPU leave the other GPU for shares", func(t *testing.T) {
		c := newCluster(t, nodeOpts{profile: "t4:2", timeSlices: 2})
		for _, want := range []string{"gpu-0-ts-0", "gpu-0-ts-1"} {
			if dev := c.mustPlace(ts); dev != want {
				t.Fatalf("partition on %s, want %s", dev, want)
			}
		}
		if dev := c.mustPlace(req{class: "gpu.tessera.dev", memory: "4Gi"}); dev != "gpu-1" {
			t.Fatalf("share on %s, want gpu-1", dev)
		}
		c.mustNotPlace(ts)
	})
	t.Run("partition memory is usable memory divided by N", func(t *testing.T) {
		c := newCluster(t, nodeOpts{profile: "t4", timeSlices: 3})
		c.mustPlace(ts)
		slices := c.alloc.Slices
		for _, s := range slices {
			for _, d := range s.Spec.Devices {
				if d.Name == "gpu-0-ts-0" {
					got := d.Capacity["memory"].Value
					if got.Value() != 5034<<20 {
						t.Fatalf("partition memory %s, want 5034Mi (15104Mi/3 rounded down to MiB)", got.String())
					}
					return
				}
			}
		}
		t.Fatal("gpu-0-ts-0 not published")
	})
}

func TestH100MIG(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fit      []string
		notFit   []string
		wantDevs []string
	}{
		{name: "seven 1g.10gb fit, an eighth does not", fit: repeat("1g.10gb", 7), notFit: []string{"1g.10gb"}},
		{name: "three 2g.20gb and one 1g.10gb fit", fit: append(repeat("2g.20gb", 3), "1g.10gb")},
		{name: "one 1g.10gb and then three 2g.20gb fit", fit: append([]string{"1g.10gb"}, repeat("2g.20gb", 3)...)},
		{name: "four 2g.20gb do not", fit: repeat("2g.20gb", 3), notFit: []string{"2g.20gb"}},
		{name: "4g.40gb and 3g.40gb fit", fit: []string{"4g.40gb", "3g.40gb"}, wantDevs: []string{"gpu-0-mig-4g40gb-0", "gpu-0-mig-3g40gb-4"}},
		{name: "3g.40gb then 4g.40gb fit", fit: []string{"3g.40gb", "4g.40gb"}, wantDevs: []string{"gpu-0-mig-3g40gb-4", "gpu-0-mig-4g40gb-0"}},
		{name: "two 3g.40gb then nothing", fit: []string{"3g.40gb", "3g.40gb"}, notFit: []string{"1g.10gb", "2g.20gb"}},
		{name: "7g.80gb takes the whole GPU", fit: []string{"7g.80gb"}, notFit: []string{"1g.10gb"}},
		{name: "only one 1g.10gb+me", fit: []string{"1g.10gb+me"}, notFit: []string{"1g.10gb+me", "7g.80gb"}},
		{name: "four 1g.20gb, then no 2g.20gb", fit: repeat("1g.20gb", 4), notFit: []string{"2g.20gb", "1g.10gb"}},
		{name: "1g.10gb placements leave room for 4g.40gb", fit: append(repeat("1g.10gb", 3), "4g.40gb")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, nodeOpts{profile: "h100-80gb", mig: true})
			for i, p := range tc.fit {
				dev := c.mustPlace(migReq(p))
				if tc.wantDevs != nil && dev != tc.wantDevs[i] {
					t.Fatalf("%s landed on %s, want %s", p, dev, tc.wantDevs[i])
				}
			}
			for _, p := range tc.notFit {
				c.mustNotPlace(migReq(p))
			}
			assertCreatable(t, c.devices())
		})
	}
}

// assertCreatable creates the allocated MIG devices on a fresh mock GPU:
// what the scheduler picked must be physically creatable.
func assertCreatable(t *testing.T, devices []string) {
	t.Helper()
	spec, _ := nvmlmock.ParseProfile("h100-80gb")
	srv, err := nvmlmock.New(nvmlmock.Options{Spec: spec, Seed: nodeName, MIGEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := discover.Discover(context.Background(), srv)
	if err != nil {
		t.Fatal(err)
	}
	dev := srv.Devices()[0]
	for _, name := range devices {
		n, err := devicemodel.ParseName(name)
		if err != nil {
			t.Fatal(err)
		}
		var prof *inventory.MIGProfile
		for i, p := range inv.GPUs[0].MIGProfiles {
			if devicemodel.ProfileToken(p.Name) == n.ProfileToken {
				prof = &inv.GPUs[0].MIGProfiles[i]
			}
		}
		if prof == nil {
			t.Fatalf("no profile for %s", name)
		}
		info, _ := dev.GetGpuInstanceProfileInfo(prof.GIProfileID)
		var size int
		for _, pl := range prof.Placements {
			if pl.Start == n.Start {
				size = pl.Size
			}
		}
		if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvmlPlacement(n.Start, size)[0]); ret != nvml.SUCCESS {
			t.Fatalf("allocated set %v is not creatable: %s failed with %v", devices, name, ret)
		}
	}
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func nvmlPlacement(start, size int) []nvml.GpuInstancePlacement {
	return []nvml.GpuInstancePlacement{{Start: uint32(start), Size: uint32(size)}}
}

// TestComputeDefaultBooks checks what the scheduler's `cores` books hold for
// shares that do not ask for cores, against the upstream allocator. The
// capacity's requestPolicy default is a fixed 0 (a fixed default cannot be
// proportional to memory), so such a share consumes no cores; under the
// class's computeDefault proportional the plugin caps it at its memory
// fraction (enforce.ComputeCap), which the `memory` books bound instead:
// shares that all leave cores out are capped at most 100 % together, plus
// at most one point of rounding per share. Shares that ask for cores are
// booked in `cores` only, so mixing them with proportional shares on one
// GPU can promise more than 100 % (docs/enforcement.md, "Compute default").
func TestComputeDefaultBooks(t *testing.T) {
	class := "gpu.tessera.dev"
	usable := func(c *cluster) uint64 {
		for _, s := range buildSlices(t, nodeOpts{profile: "t4"}) {
			for _, d := range s.Spec.Devices {
				if d.Name == "gpu-0" {
					q := d.Capacity["memory"].Value
					return uint64(q.Value())
				}
			}
		}
		t.Fatal("no gpu-0")
		return 0
	}
	// caps returns the compute limit the plugin enforces for every placed
	// claim and checks that the books hold exactly the requested cores.
	caps := func(t *testing.T, c *cluster, computeDefault v1alpha1.ComputeDefault) (sum int, booked int64) {
		cfg := &v1alpha1.GpuConfig{ComputeDefault: computeDefault}
		cfg.Normalize()
		u := usable(c)
		for _, r := range c.results {
			res := r.Devices.Results[0]
			mem := res.ConsumedCapacity["memory"]
			cores := res.ConsumedCapacity["cores"]
			booked += cores.Value()
			cp, err := enforce.ComputeCap(enforce.Allocation{Device: res.Device, Type: devicemodel.TypeGPU, Memory: uint64(mem.Value()), Cores: int(cores.Value()), Usable: u, Whole: uint64(mem.Value()) >= u, Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			if cp == 0 {
				cp = 100
			}
			sum += cp
		}
		return sum, booked
	}
	tests := []struct {
		name           string
		computeDefault v1alpha1.ComputeDefault
		shares         []req
		notFit         *req
		wantSum        int   // sum of the enforced compute limits
		wantBooked     int64 // sum of consumed cores
	}{
		{
			name:           "four quarter shares without cores are capped at 25 each, book no cores",
			computeDefault: v1alpha1.ComputeProportional,
			shares:         repeatReq(req{class: class, memory: "3776Mi"}, 4),
			notFit:         &req{class: class, memory: "3776Mi"},
			wantSum:        100, wantBooked: 0,
		},
		{
			name:           "uneven shares without cores: memory books bound the caps, rounding adds at most one point each",
			computeDefault: v1alpha1.ComputeProportional,
			shares:         []req{{class: class, memory: "1Gi"}, {class: class, memory: "5000Mi"}, {class: class, memory: "9056Mi"}},
			notFit:         &req{class: class, memory: "256Mi"},
			wantSum:        101, wantBooked: 0, // 7 + 34 + 60 for exactly 100 % of the memory
		},
		{
			name:           "uncapped shares without cores each may use the whole GPU",
			computeDefault: v1alpha1.ComputeUncapped,
			shares:         repeatReq(req{class: class, memory: "3776Mi"}, 2),
			wantSum:        200, wantBooked: 0,
		},
		{
			name:           "requested cores are booked and enforced alike",
			computeDefault: v1alpha1.ComputeProportional,
			shares:         []req{{class: class, memory: "1Gi", cores: "60"}, {class: class, memory: "1Gi", cores: "40"}},
			notFit:         &req{class: class, memory: "1Gi", cores: "1"},
			wantSum:        100, wantBooked: 100,
		},
		{
			// The documented limit of a fixed default: the proportional
			// share's 50 % is not in the cores books, so a share asking
			// for 100 still fits next to it.
			name:           "mixing: a proportional share is not in the cores books",
			computeDefault: v1alpha1.ComputeProportional,
			shares:         []req{{class: class, memory: "7552Mi"}, {class: class, memory: "1Gi", cores: "100"}},
			wantSum:        150, wantBooked: 100,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, nodeOpts{profile: "t4"})
			for _, r := range tt.shares {
				if dev := c.mustPlace(r); dev != "gpu-0" {
					t.Fatalf("%+v landed on %s", r, dev)
				}
			}
			if tt.notFit != nil {
				c.mustNotPlace(*tt.notFit)
			}
			sum, booked := caps(t, c, tt.computeDefault)
			if sum != tt.wantSum || booked != tt.wantBooked {
				t.Errorf("enforced compute limits sum to %d with %d cores booked, want %d and %d", sum, booked, tt.wantSum, tt.wantBooked)
			}
		})
	}
}

func repeatReq(r req, n int) []req {
	out := make([]req, n)
	for i := range out {
		out[i] = r
	}
	return out
}
