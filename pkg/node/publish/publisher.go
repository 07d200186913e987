// Package publish keeps a node's ResourceSlices in step with its GPUs: it
// rediscovers them, builds the slices with the device model's current
// configuration (health taints, GPUs other drivers hand out), and hands
// them to the kubelet plugin library's ResourceSlice controller when what
// would be published changes; a failed scan keeps the last good slices.
package publish

import (
	"context"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/gpu/nodeslices"
)

// Sink receives the pool to publish (kubeletplugin.Helper.PublishResources).
type Sink func(ctx context.Context, resources resourceslice.DriverResources) error

// Publisher rediscovers the GPUs and republishes when what would be
// published changes. A failed scan keeps the last good slices.
type Publisher struct {
	lib      nvml.Interface
	nodeName string
	config   func() devicemodel.Config
	sink     Sink
	trigger  chan struct{}

	mu        sync.Mutex
	inventory *inventory.Inventory
	pending   []resourceslice.Slice
	published []resourceslice.Slice
}

// NewPublisher returns a publisher; config is read on every sync so that
// health taints and configuration changes are picked up.
func NewPublisher(lib nvml.Interface, nodeName string, config func() devicemodel.Config, sink Sink) *Publisher {
	return &Publisher{lib: lib, nodeName: nodeName, config: config, sink: sink, trigger: make(chan struct{}, 1)}
}

// Inventory returns the last good inventory (nil before the first sync).
func (p *Publisher) Inventory() *inventory.Inventory {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inventory
}

// Published says whether the slices were published at least once.
func (p *Publisher) Published() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.published != nil
}

// Trigger asks for a sync soon (e.g. after a MIG instance appeared or a
// device turned unhealthy).
func (p *Publisher) Trigger() {
	select {
	case p.trigger <- struct{}{}:
	default:
	}
}

// Refresh rediscovers the GPUs and rebuilds the devices without
// publishing, so that prepare has an inventory before the plugin serves.
func (p *Publisher) Refresh(ctx context.Context) error {
	inv, slices, err := nodeslices.Model(ctx, p.lib, p.config())
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inventory = inv
	p.pending = slices
	return nil
}

// Sync refreshes and publishes if what would be published changed.
func (p *Publisher) Sync(ctx context.Context) error {
	if err := p.Refresh(ctx); err != nil {
		return err
	}
	p.mu.Lock()
	slices, inv := p.pending, p.inventory
	unchanged := p.published != nil && equality.Semantic.DeepEqual(p.published, slices)
	p.mu.Unlock()
	logger := klog.FromContext(ctx)
	if unchanged {
		logger.V(6).Info("Inventory unchanged, not republishing")
		return nil
	}
	resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		p.nodeName: {Slices: slices},
	}}
	if err := p.sink(ctx, resources); err != nil {
		return err
	}
	p.mu.Lock()
	p.published = slices
	p.mu.Unlock()
	devices := 0
	for _, s := range slices {
		devices += len(s.Devices)
	}
	logger.Info("Published ResourceSlices", "slices", len(slices), "devices", devices, "gpus", len(inv.GPUs))
	return nil
}

// Run syncs every interval and on Trigger until ctx ends. Errors are logged;
// the last good slices stay published.
func (p *Publisher) Run(ctx context.Context, interval time.Duration) {
	logger := klog.FromContext(ctx)
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-p.trigger:
		}
		if err := p.Sync(ctx); err != nil {
			logger.Error(err, "Rescan failed; keeping the last published ResourceSlices")
		}
	}
}
