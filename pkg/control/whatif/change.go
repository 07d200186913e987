package whatif

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/decide"
)

// NodeGroup is Count nodes of one mock profile (e.g. dgxh100).
type NodeGroup struct {
	Count   int
	Profile string
}

// NodeSlicer makes the ResourceSlices a node of a mock profile publishes.
// The caller passes it (kubectl-tessera: pkg/gpu/nodeslices.MockProfile),
// so that the controller, which runs what-if in shadow mode, links no NVML
// bindings.
type NodeSlicer func(ctx context.Context, profile, node string) ([]*resourceapi.ResourceSlice, error)

// Change is what a what-if run tries.
type Change struct {
	// Queues replace the queues of the same name, or are added.
	Queues []*v1alpha1.Queue
	// AddNodes are new nodes of mock profiles, publishing the slices
	// NodeSlices makes for them (pkg/gpu/nodeslices: exactly the kubelet
	// plugin's, through its own discover → model → slices path).
	AddNodes   []NodeGroup
	NodeSlices NodeSlicer
	// RemoveNodes are nodes to take away, with their slices and the pods
	// bound to them (their claims lose their allocations).
	RemoveNodes []string
	// Config is the engine's configuration after the change; nil keeps
	// the one before.
	Config *decide.Config
}

// Apply returns the state with the change made (the input is not
// modified) and the pods the change removes (bound to removed nodes).
func (c Change) Apply(ctx context.Context, s *decide.Snapshot) (*decide.Snapshot, []*corev1.Pod, error) {
	out := *s
	if len(c.Queues) > 0 {
		out.Queues = WithQueues(s.Queues, c.Queues)
	}
	existing := map[string]bool{}
	for _, n := range s.Nodes {
		existing[n.Name] = true
	}
	for _, g := range c.AddNodes {
		for i := 0; i < g.Count; i++ {
			name := fmt.Sprintf("whatif-%s-%d", strings.NewReplacer(":", "-", ",", "-").Replace(g.Profile), i)
			for existing[name] {
				name += "x"
			}
			existing[name] = true
			if c.NodeSlices == nil {
				return nil, nil, fmt.Errorf("adding nodes of %s: no NodeSlices given", g.Profile)
			}
			slices, err := c.NodeSlices(ctx, g.Profile, name)
			if err != nil {
				return nil, nil, err
			}
			out.Nodes = append(append([]*corev1.Node(nil), out.Nodes...), readyNode(name))
			out.Slices = append(append([]*resourceapi.ResourceSlice(nil), out.Slices...), slices...)
		}
	}
	var removed []*corev1.Pod
	if len(c.RemoveNodes) > 0 {
		gone := map[string]bool{}
		for _, n := range c.RemoveNodes {
			if !existing[n] {
				return nil, nil, fmt.Errorf("--remove-node %s: no such node", n)
			}
			gone[n] = true
		}
		out.Nodes = nil
		for _, n := range s.Nodes {
			if !gone[n.Name] {
				out.Nodes = append(out.Nodes, n)
			}
		}
		pools := map[string]bool{}
		out.Slices = nil
		for _, sl := range s.Slices {
			if sl.Spec.NodeName != nil && gone[*sl.Spec.NodeName] {
				pools[sl.Spec.Driver+"/"+sl.Spec.Pool.Name] = true
				continue
			}
			out.Slices = append(out.Slices, sl)
		}
		removedUID := map[types.UID]bool{}
		out.Pods = nil
		for _, p := range s.Pods {
			if gone[p.Spec.NodeName] {
				removed = append(removed, p)
				removedUID[p.UID] = true
				continue
			}
			out.Pods = append(out.Pods, p)
		}
		out.Claims = nil
		for _, cl := range s.Claims {
			if touches(cl, pools, removedUID) {
				// Deallocated: the removed pods' claims, and those
				// allocated from the removed nodes' devices.
				cl = cl.DeepCopy()
				cl.Status = resourceapi.ResourceClaimStatus{}
			}
			out.Claims = append(out.Claims, cl)
		}
	}
	return &out, removed, nil
}

func touches(cl *resourceapi.ResourceClaim, pools map[string]bool, pods map[types.UID]bool) bool {
	for _, r := range cl.Status.ReservedFor {
		if pods[r.UID] {
			return true
		}
	}
	if cl.Status.Allocation != nil {
		for _, r := range cl.Status.Allocation.Devices.Results {
			if pools[r.Driver+"/"+r.Pool] {
				return true
			}
		}
	}
	return false
}

func readyNode(name string) *corev1.Node {
	return &corev1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("whatif-" + name), Labels: map[string]string{"kubernetes.io/hostname": name}},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}
}

// DecisionFlags are the controller flags that change decisions; what-if
// and the shadow take them in the controller's syntax.
var DecisionFlags = []string{"reclaim", "max-reclaims-per-cycle", "kubernetes-version", "scheduler-feature-gates"}

// ParseControllerFlags reads controller flags (--reclaim=false,
// --max-reclaims-per-cycle=4, --kubernetes-version=v1.35.2,
// --scheduler-feature-gates=...) into an engine configuration, starting
// from base. Flags that do not change decisions are refused by name.
func ParseControllerFlags(args string, base decide.Config) (decide.Config, error) {
	fs := pflag.NewFlagSet("controller-flags", pflag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	reclaim := fs.Bool("reclaim", base.Reclaim, "")
	maxReclaims := fs.Int("max-reclaims-per-cycle", base.MaxReclaimsPerCycle, "")
	version := fs.String("kubernetes-version", "", "")
	gates := fs.String("scheduler-feature-gates", "", "")
	if err := fs.Parse(strings.Fields(args)); err != nil {
		return base, fmt.Errorf("--controller-flags: %w (flags that change decisions: --%s)", err, strings.Join(DecisionFlags, ", --"))
	}
	if fs.NArg() > 0 {
		return base, fmt.Errorf("--controller-flags: unexpected %q", fs.Args())
	}
	cfg := base
	cfg.Reclaim, cfg.MaxReclaimsPerCycle = *reclaim, *maxReclaims
	if *version != "" {
		f, err := allocation.FeaturesFor(*version)
		if err != nil {
			return base, fmt.Errorf("--controller-flags: --kubernetes-version: %w", err)
		}
		cfg.Features = f
	}
	if *gates != "" {
		f, err := allocation.Override(cfg.Features, *gates)
		if err != nil {
			return base, fmt.Errorf("--controller-flags: --scheduler-feature-gates: %w", err)
		}
		cfg.Features = f
	}
	return cfg, nil
}
