package decide_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	. "github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/sliceintern"
	"github.com/tessera-dev/tessera/test/testutil"
)

// benchCluster publishes n 8 x H100 nodes: one node is published by the
// real pipeline and copied under the other names (pool, node and slice
// names are per node; the allocator and the catalog key devices by pool).
func benchCluster(b *testing.B, n int) ([]*corev1.Node, []*resourceapi.ResourceSlice) {
	return benchClusterOf(b, n, NodeOptions{Profile: "dgxh100"})
}

// benchClusterOf is benchCluster with other node options (dynamic MIG).
func benchClusterOf(b *testing.B, n int, o NodeOptions) ([]*corev1.Node, []*resourceapi.ResourceSlice) {
	b.Helper()
	proto, err := NodeSlices("node-00000", o)
	if err != nil {
		b.Fatal(err)
	}
	var nodes []*corev1.Node
	var slices []*resourceapi.ResourceSlice
	for i := range n {
		name := fmt.Sprintf("node-%05d", i)
		nodes = append(nodes, Node(name))
		for _, s := range proto {
			c := s.DeepCopy()
			c.Name = strings.Replace(s.Name, "node-00000", name, 1)
			c.Spec.NodeName = ptr.To(name)
			c.Spec.Pool.Name = name
			slices = append(slices, c)
		}
	}
	return nodes, slices
}

// cacheForm returns the slices as the controller's cache keeps them (each
// a stored object, its devices' attributes in the interner's compact form)
// and the interner that reads them (decide.Snapshot.Attributes).
func cacheForm(b testing.TB, slices []*resourceapi.ResourceSlice) (*sliceintern.Interner, []*resourceapi.ResourceSlice) {
	in := sliceintern.New(0, nil)
	out := make([]*resourceapi.ResourceSlice, len(slices))
	for i, s := range slices {
		c := s.DeepCopy()
		c.UID, c.ResourceVersion = types.UID(fmt.Sprintf("uid-%06d", i)), "1"
		if _, err := in.Transform()(c); err != nil {
			b.Fatal(err)
		}
		out[i] = c
	}
	return in, out
}

// benchQueues: 10 departments with 99 team queues each (1,000 queues);
// each team is guaranteed 1 GPU's memory and limited to 40 GPUs' worth.
func benchQueues() ([]*v1alpha1.Queue, []string) {
	var qs []*v1alpha1.Queue
	var leaves []string
	for d := range 10 {
		dept := fmt.Sprintf("dept-%d", d)
		qs = append(qs, Queue(dept, "", "", ""))
		for t := range 99 {
			name := fmt.Sprintf("%s-team-%02d", dept, t)
			qs = append(qs, Queue(name, dept, "80Gi", "3200Gi"))
			leaves = append(leaves, name)
		}
	}
	return qs, leaves
}

func benchPending(snap *decide.Snapshot, leaves []string) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	shares := []string{"s10", "s20", "s40"}
	for i := range 10000 {
		o := PodOptions{Queue: leaves[i%len(leaves)], Gated: true, Created: metav1.NewTime(t0.Add(time.Duration(i) * time.Millisecond))}
		name := fmt.Sprintf("p%05d", i)
		switch {
		case i < 7000:
			o.Templates = []string{shares[i%3]}
		case i < 9000:
			o.Templates = []string{"gpu"}
		default:
			g := (i - 9000) / 8
			o.Queue = leaves[(g*7)%len(leaves)]
			o.Gang, o.GangSize = fmt.Sprintf("g%03d", g), "8"
			o.Templates = []string{"gpu"}
		}
		snap.Pods = append(snap.Pods, Pod("ns", name, o))
	}
}

func benchTemplates() []*resourceapi.ResourceClaimTemplate {
	return []*resourceapi.ResourceClaimTemplate{
		Template("ns", "s10", Request{Memory: "10Gi"}),
		Template("ns", "s20", Request{Memory: "20Gi"}),
		Template("ns", "s40", Request{Memory: "40Gi"}),
		Template("ns", "gpu", Request{}),
		Template("ns", "eight", Request{Count: 8}),
	}
}

// fillNodes runs an admitted, allocated 8-GPU pod on each of the first n
// nodes.
func fillNodes(snap *decide.Snapshot, nodes []*corev1.Node, n int, queue string) {
	for i := range n {
		p := Pod("ns", fmt.Sprintf("busy-%04d", i), PodOptions{Queue: queue, Templates: []string{"eight"}})
		claim := Claim("ns", p.Name+"-t0", Request{Count: 8})
		p.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "t0", ResourceClaimName: ptr.To(claim.Name)}}
		var res []resourceapi.DeviceRequestAllocationResult
		for g := range 8 {
			res = append(res, resourceapi.DeviceRequestAllocationResult{Request: "r0", Driver: "gpu.tessera.dev", Pool: nodes[i].Name, Device: fmt.Sprintf("gpu-%d", g)})
		}
		claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: res}}
		snap.Pods = append(snap.Pods, p)
		snap.Claims = append(snap.Claims, claim)
	}
}

// BenchmarkAdmissionFullCluster re-decides the same 10,000 pending pods
// when every GPU is taken: the cost of a cycle in which everything waits.
func BenchmarkAdmissionFullCluster(b *testing.B) {
	nodes, slices := benchCluster(b, 1000)
	queues, leaves := benchQueues()
	snap := &decide.Snapshot{Queues: queues, Nodes: nodes, Slices: slices, Classes: Classes(), Templates: benchTemplates()}
	fillNodes(snap, nodes, 1000, leaves[0])
	benchPending(snap, leaves)
	ctx := context.Background()
	eng := decide.NewEngine(decide.DefaultConfig())
	b.ResetTimer()
	var d *decide.Decision
	for b.Loop() {
		var err error
		d, err = eng.Decide(ctx, snap)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if d.Stats.Admitted != 0 {
		b.Fatalf("admitted on a full cluster: %+v", d.Stats)
	}
	b.ReportMetric(float64(d.Stats.Pending)/(float64(b.Elapsed())/float64(b.N)/1e9), "workloads/s")
	b.ReportMetric(float64(d.Stats.AllocatorCalls), "allocator-calls")
}

// BenchmarkAdmission decides 10,000 pending pods (7,000 single pods with
// memory shares of 10, 20 or 40Gi, 2,000 single pods with a whole GPU and
// 1,000 pods in gangs of 8 with a whole GPU each) in 1,000 queues on 1,000
// simulated 8-GPU nodes, in one cycle from a fresh engine. It reports
// workloads decided per second.
func BenchmarkAdmission(b *testing.B) {
	nodes, slices := benchCluster(b, 1000)
	queues, leaves := benchQueues()
	snap := &decide.Snapshot{Queues: queues, Nodes: nodes, Slices: slices, Classes: Classes(), Templates: benchTemplates()}
	benchPending(snap, leaves)
	ctx := context.Background()
	b.ResetTimer()
	var d *decide.Decision
	for b.Loop() {
		var err error
		d, err = decide.NewEngine(decide.DefaultConfig()).Decide(ctx, snap)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	workloads := d.Stats.Pending
	b.ReportMetric(float64(workloads)/(float64(b.Elapsed())/float64(b.N)/1e9), "workloads/s")
	b.ReportMetric(float64(d.Stats.Admitted), "admitted")
	b.ReportMetric(float64(d.Stats.AllocatorCalls), "allocator-calls")
	if d.Stats.Admitted == 0 {
		b.Fatalf("nothing admitted: %+v", d.Stats)
	}
}

// BenchmarkGang512 decides one gang of 512 pods, each with a whole GPU, on
// 1,000 simulated 8-GPU nodes of which the first half is full.
func BenchmarkGang512(b *testing.B) {
	nodes, slices := benchCluster(b, 1000)
	snap := &decide.Snapshot{Queues: []*v1alpha1.Queue{Queue("train", "", "", "")}, Nodes: nodes, Slices: slices, Classes: Classes(), Templates: benchTemplates()}
	// The first 500 nodes are full.
	fillNodes(snap, nodes, 500, "train")
	ctx := context.Background()
	for i := range 512 {
		snap.Pods = append(snap.Pods, Pod("ns", fmt.Sprintf("train-%03d", i), PodOptions{Queue: "train", Gang: "train", GangSize: "512", Gated: true, Templates: []string{"gpu"}}))
	}
	b.ResetTimer()
	var d *decide.Decision
	for b.Loop() {
		var err error
		d, err = decide.NewEngine(decide.DefaultConfig()).Decide(ctx, snap)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if d.Stats.Admitted != 1 || len(d.Admit[0].Pods) != 512 {
		b.Fatalf("gang not admitted: %+v %s", d.Stats, d.Waiting[0].Message)
	}
	b.ReportMetric(float64(d.Stats.AllocatorCalls), "allocator-calls")
}

// BenchmarkDecideScale decides the 10,000 pending pods of
// BenchmarkAdmission (1,000 queues) on 500 to 10,000 simulated 8 x H100
// nodes, so that the report shows how a cycle's cost grows with the
// cluster: "first" from a fresh engine (a controller's first cycle),
// "next" with the engine of the previous cycle and the same slices (every
// later cycle; what it admitted is forgotten first, so that it decides
// the same). Memory and allocations are per cycle (-benchmem).
//
//	go test -run='^$' -bench=DecideScale -benchtime=1x -benchmem ./pkg/control/decide/
func BenchmarkDecideScale(b *testing.B) {
	benchDecideScale(b, NodeOptions{Profile: "dgxh100"}, func([]*resourceapi.ResourceSlice) []*resourceapi.ResourceClaimTemplate { return benchTemplates() }, 500, 1000, 5000, 10000)
}

// BenchmarkDecideScaleMIG is BenchmarkDecideScale on nodes in dynamic MIG
// mode (each 8 x H100 node publishes 200 devices: the GPUs, their shares
// and every MIG placement); every pod asks the smallest MIG device
// (1g.10gb), as the scale run's (m) workload does.
func BenchmarkDecideScaleMIG(b *testing.B) {
	benchDecideScale(b, NodeOptions{Profile: "dgxh100", MIG: true}, smallestMIG, 500, 1000, 5000)
}

// smallestMIG are benchTemplates' names, each asking the smallest MIG
// device the slices publish.
func smallestMIG(slices []*resourceapi.ResourceSlice) []*resourceapi.ResourceClaimTemplate {
	var smallest *resource.Quantity
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			if a := d.Attributes[devicemodel.AttrType]; a.StringValue != nil && *a.StringValue == devicemodel.TypeMIG {
				if c := d.Capacity[devicemodel.CapMemory].Value; smallest == nil || c.Cmp(*smallest) < 0 {
					smallest = &c
				}
			}
		}
	}
	if smallest == nil {
		panic("no MIG device published")
	}
	mig := Request{Class: "mig.tessera.dev", Selector: fmt.Sprintf(`device.capacity["gpu.tessera.dev"].memory.compareTo(quantity(%q)) == 0`, smallest.String())}
	var out []*resourceapi.ResourceClaimTemplate
	for _, t := range benchTemplates() {
		out = append(out, Template("ns", t.Name, mig))
	}
	return out
}

func benchDecideScale(b *testing.B, o NodeOptions, templates func([]*resourceapi.ResourceSlice) []*resourceapi.ResourceClaimTemplate, sizes ...int) {
	queues, leaves := benchQueues()
	for _, n := range sizes {
		// The cluster is built inside its sub-benchmark: a run that
		// selects one size (-bench 'DecideScale/^nodes=500$') builds no
		// other.
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			nodes, published := benchClusterOf(b, n, o)
			attrs, slices := cacheForm(b, published)
			snap := &decide.Snapshot{Queues: queues, Nodes: nodes, Slices: slices, Attributes: attrs, Classes: Classes(), Templates: templates(published)}
			benchPending(snap, leaves)
			benchCycles(b, snap, n)
		})
	}
}

// benchCycles runs the first/ and next/ sub-benchmarks of
// benchDecideScale on the snapshot of n nodes.
func benchCycles(b *testing.B, snap *decide.Snapshot, n int) {
	ctx := context.Background()
	var first *decide.Decision
	b.Run("first", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if first, err = decide.NewEngine(decide.DefaultConfig()).Decide(ctx, snap); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(first.Stats.Admitted), "admitted")
		b.ReportMetric(float64(n*8), "gpus")
		devices := 0
		for _, s := range snap.Slices {
			devices += len(s.Spec.Devices)
		}
		b.ReportMetric(float64(devices), "devices")
	})
	b.Run("next", func(b *testing.B) {
		b.ReportAllocs()
		e := decide.NewEngine(decide.DefaultConfig())
		if _, err := e.Decide(ctx, snap); err != nil {
			b.Fatal(err)
		}
		var d *decide.Decision
		for b.Loop() {
			e.Forget(snap.Pods...)
			var err error
			if d, err = e.Decide(ctx, snap); err != nil {
				b.Fatal(err)
			}
		}
		if first != nil && d.Stats.Admitted != first.Stats.Admitted {
			b.Fatalf("the next cycle admitted %d, the first %d", d.Stats.Admitted, first.Stats.Admitted)
		}
		b.ReportMetric(float64(d.Stats.Admitted), "admitted")
	})
}

// BenchmarkEngineRetained measures what an engine keeps between cycles
// per published device (its catalog, node indexes and CEL results) over
// the slices as the controller's cache keeps them, on 100
// nodes in dynamic MIG mode after one cycle over 10,000 pending pods that
// each ask the smallest MIG device: the controller's memory beside its
// cache of the slices themselves (pkg/control/sliceintern).
func BenchmarkEngineRetained(b *testing.B) {
	queues, leaves := benchQueues()
	nodes, published := benchClusterOf(b, 100, NodeOptions{Profile: "dgxh100", MIG: true})
	attrs, slices := cacheForm(b, published)
	snap := &decide.Snapshot{Queues: queues, Nodes: nodes, Slices: slices, Attributes: attrs, Classes: Classes(), Templates: smallestMIG(published)}
	benchPending(snap, leaves)
	devices := 0
	for _, s := range slices {
		devices += len(s.Spec.Devices)
	}
	var per float64
	for b.Loop() {
		before := testutil.LiveHeap()
		e := decide.NewEngine(decide.DefaultConfig())
		if _, err := e.Decide(context.Background(), snap); err != nil {
			b.Fatal(err)
		}
		after := testutil.LiveHeap()
		runtime.KeepAlive(e)
		per = (float64(after) - float64(before)) / float64(devices)
	}
	b.ReportMetric(per, "B/device")
	b.ReportMetric(float64(devices), "devices")
}
