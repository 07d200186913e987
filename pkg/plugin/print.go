package plugin

import (
	"context"
	"fmt"
	"io"
	"k8s.io/klog/v2"

	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/pkg/backend"
	"github.com/tessera-dev/tessera/pkg/devicemodel"
	"github.com/tessera-dev/tessera/pkg/discover"
	"github.com/tessera-dev/tessera/pkg/publish"
)

// PrintSlices writes the ResourceSlices this node would publish to w as a
// YAML stream, without talking to a cluster.
func PrintSlices(ctx context.Context, o *Options, w io.Writer) error {
	cfg, err := o.DeviceModelConfig()
	if err != nil {
		return err
	}
	node := o.NodeName
	if node == "" {
		node = "node"
	}
	bo := o.Backend
	bo.Seed = node
	be, err := backend.Open(bo)
	if err != nil {
		return err
	}
	defer func() {
		if err := be.Close(); err != nil {
			klog.FromContext(ctx).Error(err, "Shutting down the GPU backend")
		}
	}()
	inv, err := discover.Discover(ctx, be)
	if err != nil {
		return err
	}
	slices, err := devicemodel.Build(inv, cfg)
	if err != nil {
		return err
	}
	for i, s := range publish.ResourceSlices(node, slices) {
		data, err := yaml.Marshal(s)
		if err != nil {
			return err
		}
		if i > 0 {
			fmt.Fprintln(w, "---")
		}
		if _, err := w.Write(data); err != nil {
			return err
		}
	}
	return nil
}
