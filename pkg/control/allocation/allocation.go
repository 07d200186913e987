// Package allocation runs the scheduler's own DRA allocator in process:
// the same code kube-scheduler runs, over given ResourceSlices, DeviceClasses
// and already allocated claims. The device-model tests, the controller's
// admission simulation and the benchmarks all go through it.
package allocation

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// SchedulerFeatures are the allocator features kube-scheduler 1.37 enables
// by default; the controller uses FeaturesFor its cluster's version.
var SchedulerFeatures = func() structured.Features {
	f, err := FeaturesFor(fmt.Sprintf("v1.%d.0", NewestKnown))
	if err != nil {
		panic(err)
	}
	return f
}()

// Classes is a DeviceClassLister over a fixed list.
type Classes []*resourceapi.DeviceClass

// Get implements structured.DeviceClassLister.
func (c Classes) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, dc := range c {
		if dc.Name == name {
			return dc, nil
		}
	}
	return nil, fmt.Errorf("device class %q not found", name)
}

// List implements structured.DeviceClassLister.
func (c Classes) List() ([]*resourceapi.DeviceClass, error) { return c, nil }

// State is the allocation state of a cluster: what is already allocated.
type State struct {
	structured.AllocatedState
}

// NewState returns an empty state.
func NewState() *State {
	return &State{structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}}
}

// Add records an allocation result as the scheduler does once a claim is
// allocated: exclusive devices by ID, shared ones by share ID with their
// consumed capacity.
func (s *State) Add(result *resourceapi.AllocationResult) {
	for _, r := range result.Devices.Results {
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID == nil {
			s.AllocatedDevices.Insert(id)
			continue
		}
		s.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
		if r.ConsumedCapacity != nil {
			s.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
}

// Clone copies the state so a simulation can try and throw away.
func (s *State) Clone() *State {
	c := NewState()
	c.AllocatedDevices = s.AllocatedDevices.Clone()
	c.AllocatedSharedDeviceIDs = s.AllocatedSharedDeviceIDs.Clone()
	c.AggregatedCapacity = s.AggregatedCapacity.Clone()
	return c
}

// Allocator allocates claims on one node with the scheduler's allocator.
type Allocator struct {
	Slices   []*resourceapi.ResourceSlice
	Classes  Classes
	Features structured.Features
	cache    *cel.Cache
}

// NewAllocator prepares an allocator over the given slices and classes.
func NewAllocator(slices []*resourceapi.ResourceSlice, classes Classes) *Allocator {
	return &Allocator{Slices: slices, Classes: classes, Features: SchedulerFeatures, cache: cel.NewCache(100, cel.Features{})}
}

// Allocate tries to allocate the claims jointly on node given the state.
// It returns nil results (and no error) when they do not fit.
func (a *Allocator) Allocate(ctx context.Context, node *v1.Node, state *State, claims ...*resourceapi.ResourceClaim) ([]resourceapi.AllocationResult, error) {
	return Allocate(ctx, a.Features, state, a.Classes, a.Slices, a.cache, node, claims)
}

// Allocate runs the scheduler's allocator once: the claims jointly on the
// node, over the slices, given what the state holds. It returns nil results
// (and no error) when they do not fit. Every use of the allocator in
// Tessera goes through here.
func Allocate(ctx context.Context, features structured.Features, state *State, classes Classes, slices []*resourceapi.ResourceSlice, cache *cel.Cache, node *v1.Node, claims []*resourceapi.ResourceClaim) ([]resourceapi.AllocationResult, error) {
	alloc, err := structured.NewAllocator(ctx, features, state.AllocatedState, classes, slices, cache)
	if err != nil {
		return nil, err
	}
	return alloc.Allocate(ctx, node, claims)
}
