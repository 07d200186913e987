package plugin

import (
	"context"
	"fmt"
	"io"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/pkg/gpu/nodeslices"
	"github.com/tessera-dev/tessera/pkg/node/nvmlsource"
)

// NodeSlices returns the ResourceSlices the plugin configured by o publishes
// for node, without talking to a cluster: the plugin's own data path
// (discover → model → publish) over its GPU backend. The scale harness uses
// it to give simulated nodes exactly what a real plugin would publish.
func NodeSlices(ctx context.Context, o *Options, node string) ([]*resourceapi.ResourceSlice, error) {
	cfg, err := o.DeviceModelConfig()
	if err != nil {
		return nil, err
	}
	bo := o.Backend
	bo.Seed = node
	be, err := nvmlsource.Open(bo)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := be.Close(); err != nil {
			klog.FromContext(ctx).Error(err, "Shutting down the GPU backend")
		}
	}()
	n, err := nodeslices.Build(ctx, be, cfg, node)
	if err != nil {
		return nil, err
	}
	return n.Slices, nil
}

// PrintSlices writes the ResourceSlices this node would publish to w as a
// YAML stream, without talking to a cluster.
func PrintSlices(ctx context.Context, o *Options, w io.Writer) error {
	node := o.NodeName
	if node == "" {
		node = "node"
	}
	slices, err := NodeSlices(ctx, o, node)
	if err != nil {
		return err
	}
	for i, s := range slices {
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
