package plugin

import (
	"context"
	"fmt"
	"os"

	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/node/mig"
	"github.com/tessera-dev/tessera/pkg/node/nvmlsource"
	"github.com/tessera-dev/tessera/pkg/node/prepare"
	"github.com/tessera-dev/tessera/pkg/node/publish"
)

// Standalone is the plugin's discovery and prepare path without a cluster
// or kubelet (make gpu-smoke): the same backend, device model, preparer,
// CDI specs and checkpoint as the running plugin, driven directly.
type Standalone struct {
	Preparer *prepare.Preparer
	MIG      *mig.Manager
	driver   *Driver
}

// NewStandalone opens the backend and discovers; o's directories
// (CDIRoot, PluginDataDir) should be temporary ones.
func NewStandalone(ctx context.Context, o *Options) (*Standalone, error) {
	cfg, err := o.DeviceModelConfig()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.PluginDataDir, 0o750); err != nil {
		return nil, fmt.Errorf("--plugin-data-dir: %w", err)
	}
	bo := o.Backend
	bo.Seed = o.NodeName
	if bo.MockStateDir == "" && bo.Kind == nvmlsource.Mock {
		bo.MockStateDir = o.PluginDataDir
	}
	be, err := nvmlsource.Open(bo)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	d := &Driver{opts: o, backend: be, modelCfg: cfg, ctx: ctx, cancel: cancel}
	d.publisher = publish.NewPublisher(be, o.NodeName, d.deviceModelConfig, nil)
	if err := d.publisher.Refresh(ctx); err != nil {
		d.Stop()
		return nil, err
	}
	p, err := d.newPreparer(ctx, bo)
	if err != nil {
		d.Stop()
		return nil, err
	}
	d.preparer = p
	return &Standalone{Preparer: p, MIG: mig.New(be), driver: d}, nil
}

// Inventory is what discovery found.
func (s *Standalone) Inventory() *inventory.Inventory { return s.driver.publisher.Inventory() }

// Close shuts the backend down.
func (s *Standalone) Close() { s.driver.Stop() }
