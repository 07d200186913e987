// Package mocknodes makes what-if's added nodes: the ResourceSlices the
// kubelet plugin publishes for a node of a mock profile, through the
// plugin's own discover → model → publish path. It links the node side
// (NVML's bindings), which the controller does not.
package mocknodes

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/pflag"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/control/whatif"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
	"github.com/tessera-dev/tessera/pkg/node/plugin"
)

// ParseNodes reads --add-nodes: "<count>x<profile>" groups separated by
// ";" or ",", e.g. 4xdgxh100 (the simulator's syntax).
func ParseNodes(s string) ([]whatif.NodeGroup, error) {
	groups, err := nvmlmock.ParseNodeGroups(strings.ReplaceAll(s, ",", ";"))
	if err != nil {
		return nil, err
	}
	out := make([]whatif.NodeGroup, len(groups))
	for i, g := range groups {
		out[i] = whatif.NodeGroup{Count: g.Count, Profile: g.Profile}
	}
	return out, nil
}

// NodeSlices are the ResourceSlices the kubelet plugin publishes for a node
// of the mock profile (seeded with the node's name, with the plugin's
// default flags), as the scale harness gives its fake nodes.
func NodeSlices(ctx context.Context, profile, node string) ([]*resourceapi.ResourceSlice, error) {
	o := &plugin.Options{}
	fs := pflag.NewFlagSet("kubelet-plugin", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--gpu-backend=mock", "--mock-profile=" + profile}); err != nil {
		return nil, err
	}
	slices, err := plugin.NodeSlices(ctx, o, node)
	if err != nil {
		return nil, fmt.Errorf("mock profile %q: %w", profile, err)
	}
	return slices, nil
}
