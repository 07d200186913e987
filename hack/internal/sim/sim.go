// Package sim replays a workload trace against a simulated cluster of mock
// GPU nodes, using Tessera's own published ResourceSlices and the
// scheduler's DRA allocator, under several sharing policies.
package sim

import (
	"context"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/gpu/nodeslices"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
)

// Policy is a way of sharing GPUs.
type Policy string

const (
	// WholeGPU gives every pod a whole GPU (what the device plugin does).
	WholeGPU Policy = "whole-gpu"
	// TimeSlice4 is memory-blind time slicing with 4 replicas per GPU.
	TimeSlice4 Policy = "timeslice-4"
	// Shares is Tessera memory shares.
	Shares Policy = "tessera-shares"
	// SharesMIG is Tessera shares, and MIG partitions where the GPU has MIG.
	SharesMIG Policy = "tessera-shares+mig"
)

// Policies in the order reports show them.
var Policies = []Policy{WholeGPU, TimeSlice4, Shares, SharesMIG}

// NodeGroup is Count nodes with the mock profile Profile.
type NodeGroup = nvmlmock.NodeGroup

// ParseNodes parses "<count>x<profile>" groups separated by ";", e.g.
// "10xdgxh100;25xt4:4".
func ParseNodes(s string) ([]NodeGroup, error) {
	return nvmlmock.ParseNodeGroups(s)
}

// Result is what one policy achieved on one trace.
type Result struct {
	Policy  Policy
	Jobs    int
	Placed  int
	Pending int
	// GPUsUsed counts physical GPUs with at least one pod.
	GPUsUsed int
	// MemAllocated is the GPU memory held by placed pods (bytes): their
	// share, partition, MIG instance or whole GPU.
	MemAllocated uint64
	// MemAvailable is the usable memory of the GPUs used.
	MemAvailable uint64
	// Demand is the memory the placed pods asked for.
	Demand uint64
	// HeldByQueue counts the pending pods a queue holds back (its quota
	// or limit), when the run has queues.
	HeldByQueue int
	// AdmissionTime is how long the admission cycle took.
	AdmissionTime time.Duration
	// OverCommitted counts pods on GPUs whose pods together use more memory
	// than the GPU has (they would hit out-of-memory).
	OverCommitted int
	// LowerBound is the fewest GPUs that could hold the placed pods' demand:
	// the largest GPUs of the cluster first, until their usable memory
	// covers it.
	LowerBound int
}

// PodsPerGPU is placed pods per used GPU.
func (r Result) PodsPerGPU() float64 {
	if r.GPUsUsed == 0 {
		return 0
	}
	return float64(r.Placed) / float64(r.GPUsUsed)
}

// RequestedShare is the memory the placed pods asked for over the memory
// of the GPUs they use: what whole-GPU allocation wastes.
func (r Result) RequestedShare() float64 {
	if r.MemAvailable == 0 {
		return 0
	}
	return float64(r.Demand) / float64(r.MemAvailable)
}

// Utilization is allocated over available memory of the used GPUs.
func (r Result) Utilization() float64 {
	if r.MemAvailable == 0 {
		return 0
	}
	return float64(r.MemAllocated) / float64(r.MemAvailable)
}

type gpuKey struct {
	node  int
	index int
}

type simNode struct {
	name   string
	alloc  *allocation.Allocator
	state  *allocation.State
	inv    *inventory.Inventory
	usable map[int]uint64
	// free is each GPU's memory not yet held by a pod; it rules out nodes
	// before the (much more expensive) allocator runs.
	free map[int]uint64
	mig  bool
	// failedAt is the smallest request the allocator could not place on
	// the node since its last allocation (0: none). Every policy's claim
	// is harder to satisfy the larger the request, so larger requests are
	// not tried again until the node changes.
	failedAt uint64
}

// mayFit is a necessary condition for the job to fit on the node.
func (n *simNode) mayFit(policy Policy, job Job) bool {
	if n.failedAt != 0 && job.Request >= n.failedAt {
		return false
	}
	for g, free := range n.free {
		switch policy {
		case WholeGPU:
			if free == n.usable[g] && free >= job.Request {
				return true
			}
		case TimeSlice4:
			if free >= devicemodel.TimeSliceMemory(n.usable[g], 4) {
				return true
			}
		default:
			if free >= max(job.Request, devicemodel.MinShareMemory) {
				return true
			}
		}
	}
	return false
}

// Cluster is what a trace is replayed against: nodes, and optionally the
// controller's queues.
type Cluster struct {
	Nodes []NodeGroup
	// Queues, when set, put every job behind the controller's admission:
	// jobs go to the queue named like their kind (else DefaultQueue), one
	// decision cycle of the real decision engine decides which start, and
	// those are placed in the order the controller ungates them.
	Queues []QueueSpec
	// exhaustive tries every node for every job, without the pruning of
	// simNode.mayFit (tests check that pruning changes no placement).
	exhaustive bool
}

// RunPolicies runs the trace under every policy of Policies, one after the
// other, and returns the results in that order. (They share nothing and once
// ran in parallel; one at a time costs make bench's packing section about
// 10 s, and keeps this package free of goroutines, so that `make unit` tests
// it without the race detector: NORACE_PKGS.)
func RunPolicies(ctx context.Context, cl Cluster, jobs []Job) ([]Result, error) {
	results := make([]Result, 0, len(Policies))
	for _, p := range Policies {
		r, err := Run(ctx, cl, jobs, p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		results = append(results, r)
	}
	return results, nil
}

// Run places jobs in order; each job goes to the first node where the
// scheduler's allocator finds a device (nodes in the given order).
func Run(ctx context.Context, cl Cluster, jobs []Job, policy Policy) (Result, error) {
	res := Result{Policy: policy, Jobs: len(jobs)}
	classes, nodes, claims, err := build(ctx, cl, jobs, policy)
	if err != nil {
		return res, err
	}
	usage := map[gpuKey]uint64{}
	podsOn := map[gpuKey]int{}
	order := make([]int, len(jobs))
	for i := range jobs {
		order[i] = i
	}
	if len(cl.Queues) > 0 {
		a, err := newAdmission(nodes, jobs, claims, cl.Queues, classes).admit(ctx)
		if err != nil {
			return res, err
		}
		order, res.HeldByQueue, res.AdmissionTime = a.order, a.held, a.took
		res.Pending = len(jobs) - len(order)
	}
	var placedDemand uint64
	for _, i := range order {
		job, claim := jobs[i], claims[i]
		placed := false
		for ni, n := range nodes {
			if !cl.exhaustive && !n.mayFit(policy, job) {
				continue
			}
			results, err := n.alloc.Allocate(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}, n.state, claim)
			if err != nil {
				return res, fmt.Errorf("job %s on %s: %w", job.Name, n.name, err)
			}
			if results == nil {
				if n.failedAt == 0 || job.Request < n.failedAt {
					n.failedAt = job.Request
				}
				continue
			}
			n.failedAt = 0
			n.state.Add(&results[0])
			r := results[0].Devices.Results[0]
			name, err := devicemodel.ParseName(r.Device)
			if err != nil {
				return res, err
			}
			held := heldMemory(n, r)
			n.free[name.Index] -= min(n.free[name.Index], held)
			key := gpuKey{ni, name.Index}
			usage[key] += job.Usage
			podsOn[key]++
			res.MemAllocated += held
			placedDemand += job.Request
			placed = true
			break
		}
		if placed {
			res.Placed++
		} else {
			res.Pending++
		}
	}
	res.Demand = placedDemand
	res.GPUsUsed = len(podsOn)
	for key, pods := range podsOn {
		n := nodes[key.node]
		res.MemAvailable += n.usable[key.index]
		if usage[key] > n.inv.GPUs[key.index].MemoryBytes {
			res.OverCommitted += pods
		}
	}
	res.LowerBound = lowerBound(nodes, placedDemand)
	return res, nil
}

// build publishes the cluster's nodes for the policy and writes the claim
// of every job.
func build(ctx context.Context, cl Cluster, jobs []Job, policy Policy) (allocation.Classes, []*simNode, []*resourceapi.ResourceClaim, error) {
	classes, err := loadClasses()
	if err != nil {
		return nil, nil, nil, err
	}
	var nodes []*simNode
	for _, g := range cl.Nodes {
		for range g.Count {
			n, err := newNode(ctx, fmt.Sprintf("node-%03d", len(nodes)), g.Profile, policy, classes)
			if err != nil {
				return nil, nil, nil, err
			}
			nodes = append(nodes, n)
		}
	}
	migSizes := migMemorySizes(nodes)
	claims := make([]*resourceapi.ResourceClaim, len(jobs))
	for i, job := range jobs {
		claims[i] = claimFor(policy, job, i, migSizes)
	}
	return classes, nodes, claims, nil
}

func newNode(ctx context.Context, name, profile string, policy Policy, classes allocation.Classes) (*simNode, error) {
	spec, err := nvmlmock.ParseProfile(profile)
	if err != nil {
		return nil, err
	}
	mig := false
	if policy == SharesMIG {
		for _, m := range spec.Models() {
			mig = mig || len(nvmlmock.Models[m].MIG) > 0
		}
	}
	cfg := devicemodel.DefaultConfig()
	if policy == TimeSlice4 {
		cfg.TimeSlices = 4
	}
	built, err := nodeslices.Mock(ctx, spec, mig, cfg, name)
	if err != nil {
		return nil, err
	}
	inv := built.Inventory
	n := &simNode{name: name, inv: inv, usable: map[int]uint64{}, free: map[int]uint64{}, state: allocation.NewState(), mig: mig,
		alloc: allocation.NewAllocator(built.Slices, classes)}
	for _, g := range inv.GPUs {
		u, err := devicemodel.UsableMemory(g, cfg.ReservedMemory)
		if err != nil {
			return nil, err
		}
		if g.MIGEnabled {
			u = g.MemoryBytes
		}
		n.usable[g.Index] = u
		n.free[g.Index] = u
	}
	return n, nil
}

// heldMemory is the memory a device result takes away from the GPU.
func heldMemory(n *simNode, r resourceapi.DeviceRequestAllocationResult) uint64 {
	if q, ok := r.ConsumedCapacity[devicemodel.CapMemory]; ok {
		return uint64(q.Value())
	}
	for _, s := range n.alloc.Slices {
		for _, d := range s.Spec.Devices {
			if d.Name == r.Device {
				q := d.Capacity[devicemodel.CapMemory].Value
				return uint64(q.Value())
			}
		}
	}
	return 0
}

func quantityString(b uint64) string {
	return resource.NewQuantity(int64(b), resource.BinarySI).String()
}

const classGPU, classTS, classMIG = "gpu.tessera.dev", "timeslice.tessera.dev", "mig.tessera.dev"

func memAtLeast(b uint64) resourceapi.DeviceSelector {
	return resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf(
		`device.capacity["gpu.tessera.dev"].memory.compareTo(quantity(%q)) >= 0`, quantityString(b))}}
}

// claimFor builds the claim a pod of this policy would carry.
func claimFor(policy Policy, job Job, i int, migSizes []uint64) *resourceapi.ResourceClaim {
	req := resourceapi.DeviceRequest{Name: "gpu"}
	switch policy {
	case WholeGPU:
		// A whole GPU large enough for what the pod asks.
		req.Exactly = &resourceapi.ExactDeviceRequest{DeviceClassName: classGPU, Selectors: []resourceapi.DeviceSelector{memAtLeast(job.Request)}}
	case TimeSlice4:
		// Memory-blind: any replica.
		req.Exactly = &resourceapi.ExactDeviceRequest{DeviceClassName: classTS}
	case Shares:
		req.Exactly = shareRequest(job.Request)
	case SharesMIG:
		// The smallest MIG partition that holds the request, else a share.
		// The list has room for so many sizes; the last MIG entry takes
		// every larger partition, so that every MIG device that holds the
		// request stays acceptable.
		for _, size := range migSizes {
			if size < job.Request {
				continue
			}
			op := "=="
			if len(req.FirstAvailable) == resourceapi.FirstAvailableDeviceRequestMaxSize-2 {
				op = ">="
			}
			req.FirstAvailable = append(req.FirstAvailable, resourceapi.DeviceSubRequest{
				Name:            fmt.Sprintf("mig-%d", len(req.FirstAvailable)),
				DeviceClassName: classMIG,
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf(
					`device.capacity["gpu.tessera.dev"].memory.compareTo(quantity(%q)) %s 0`, quantityString(size), op)}}},
			})
			if op == ">=" {
				break
			}
		}
		share := shareRequest(job.Request)
		req.FirstAvailable = append(req.FirstAvailable, resourceapi.DeviceSubRequest{
			Name: "share", DeviceClassName: classGPU, Capacity: share.Capacity,
		})
	}
	if req.Exactly != nil {
		req.Exactly.AllocationMode, req.Exactly.Count = resourceapi.DeviceAllocationModeExactCount, 1
	}
	for i := range req.FirstAvailable {
		req.FirstAvailable[i].AllocationMode, req.FirstAvailable[i].Count = resourceapi.DeviceAllocationModeExactCount, 1
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: job.Name, Namespace: "sim", UID: types.UID(fmt.Sprintf("sim-%d", i))},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}},
	}
}

func shareRequest(b uint64) *resourceapi.ExactDeviceRequest {
	return &resourceapi.ExactDeviceRequest{
		DeviceClassName: classGPU,
		Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			devicemodel.CapMemory: *resource.NewQuantity(int64(b), resource.BinarySI),
		}},
	}
}

// migMemorySizes lists the distinct MIG instance sizes in the cluster,
// smallest first.
func migMemorySizes(nodes []*simNode) []uint64 {
	seen := map[uint64]bool{}
	for _, n := range nodes {
		for _, g := range n.inv.GPUs {
			for _, p := range g.MIGProfiles {
				seen[p.MemoryBytes] = true
			}
		}
	}
	var out []uint64
	for s := range seen {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

func lowerBound(nodes []*simNode, demand uint64) int {
	var usable []uint64
	for _, n := range nodes {
		for _, u := range n.usable {
			usable = append(usable, u)
		}
	}
	slices.Sort(usable)
	slices.Reverse(usable)
	var sum uint64
	for i, u := range usable {
		if sum >= demand {
			return i
		}
		sum += u
	}
	if sum >= demand {
		return len(usable)
	}
	return len(usable) + 1
}
