// Package nodeslices builds the ResourceSlices a node publishes from its
// NVML (the node's library or mock GPUs): discovery, the device model, the
// slices of the node's pool. It is the one place that path is written: the
// kubelet plugin publishes what Model returns and prints what Build
// returns (--print-slices), and the engine's tests, the simulator and
// what-if's added nodes build mock nodes with Mock. It links NVML's
// bindings (discovery reads an nvml.Interface) and nothing of the kubelet
// plugin's preparation.
package nodeslices

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/discover"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
)

// Node is what a node's GPUs are and the ResourceSlices of its pool.
type Node struct {
	Inventory *inventory.Inventory
	Slices    []*resourceapi.ResourceSlice
}

// Model discovers lib's GPUs and models them: the inventory and the slices
// of the node's pool in the form the kubelet plugin library publishes.
func Model(ctx context.Context, lib nvml.Interface, cfg devicemodel.Config) (*inventory.Inventory, []resourceslice.Slice, error) {
	inv, err := discover.Discover(ctx, lib)
	if err != nil {
		return nil, nil, err
	}
	slices, err := devicemodel.Build(inv, cfg)
	if err != nil {
		return nil, nil, err
	}
	return inv, slices, nil
}

// Build is Model rendered as the ResourceSlice objects the API holds for
// node's pool (Objects).
func Build(ctx context.Context, lib nvml.Interface, cfg devicemodel.Config, node string) (*Node, error) {
	inv, slices, err := Model(ctx, lib, cfg)
	if err != nil {
		return nil, err
	}
	return &Node{Inventory: inv, Slices: Objects(node, slices)}, nil
}

// Mock builds a node of mock GPUs: spec's GPUs, their UUIDs seeded with
// the node's name (what the plugin's --gpu-backend=mock publishes on a
// node of that name), MIG-capable GPUs in MIG mode when mig.
func Mock(ctx context.Context, spec nvmlmock.NodeSpec, mig bool, cfg devicemodel.Config, node string) (*Node, error) {
	srv, err := nvmlmock.New(nvmlmock.Options{Spec: spec, Seed: node, MIGEnabled: mig})
	if err != nil {
		return nil, err
	}
	n, err := Build(ctx, srv, cfg, node)
	if err != nil {
		return nil, fmt.Errorf("mock node %s: %w", node, err)
	}
	return n, nil
}

// MockProfile is Mock for a --mock-profile string (e.g. "dgxh100",
// "t4:2"), with the plugin's default configuration.
func MockProfile(ctx context.Context, profile, node string) (*Node, error) {
	spec, err := nvmlmock.ParseProfile(profile)
	if err != nil {
		return nil, err
	}
	return Mock(ctx, spec, false, devicemodel.DefaultConfig(), node)
}

// Objects renders the slices of one node's pool as the objects the kubelet
// plugin library publishes: pool named after the node, one generation,
// slice names prefixed with their index so that first fit walks them in
// order (the library appends a random suffix; here it is omitted).
func Objects(nodeName string, slices []resourceslice.Slice) []*resourceapi.ResourceSlice {
	out := make([]*resourceapi.ResourceSlice, 0, len(slices))
	for i, s := range slices {
		out = append(out, &resourceapi.ResourceSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceSlice"},
			ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("%05x-%s-%s", i, devicemodel.DriverName, nodeName),
			},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   devicemodel.DriverName,
				NodeName: ptr.To(nodeName),
				Pool: resourceapi.ResourcePool{
					Name:               nodeName,
					Generation:         1,
					ResourceSliceCount: int64(len(slices)),
				},
				Devices:        s.Devices,
				SharedCounters: s.SharedCounters,
			},
		})
	}
	return out
}
