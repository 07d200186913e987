package commands

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/snapshot"
	"github.com/tessera-dev/tessera/pkg/control/whatif"
	"github.com/tessera-dev/tessera/pkg/gpu/nodeslices"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
)

func newWhatIfCommand(o *Options, s Streams) *cobra.Command {
	var (
		queuesFile, from, addNodes, flags, before, version string
		removeNodes                                        []string
		all                                                bool
	)
	cmd := &cobra.Command{
		Use:   "what-if",
		Short: "What admission would do with new queues, nodes or controller flags",
		Long: `Reads the cluster's current queues, queued pods, claims, slices, classes
and nodes (or a saved "kubectl tessera snapshot" with --from), runs the
controller's decision engine on it as it is and with the change, and
prints per queue what would start, wait (and why) and be reclaimed, before
and after, then every workload whose outcome moves.

Both runs are one admission cycle from scratch (as a restarted controller
decides): it does not predict later cycles, pods finishing, or the
scheduler's choices beyond the engine's own placement simulation. Nothing
is written to the cluster.`,
		Example: `  kubectl tessera what-if -f new-queues.yaml
  kubectl tessera what-if --add-nodes 4xdgxh100
  kubectl tessera what-if --remove-node gpu-node-7
  kubectl tessera what-if --controller-flags '--reclaim=false'
  kubectl tessera what-if --from state.yaml -f new-queues.yaml --all`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			base := decide.DefaultConfig()
			if version != "" {
				f, err := allocation.FeaturesFor(version)
				if err != nil {
					return fmt.Errorf("--kubernetes-version: %w", err)
				}
				base.Features = f
			}
			base, err := whatif.ParseControllerFlags(before, base)
			if err != nil {
				return fmt.Errorf("--current-controller-flags: %w", err)
			}
			var change whatif.Change
			if queuesFile != "" {
				f, err := os.Open(queuesFile)
				if err != nil {
					return err
				}
				change.Queues, err = whatif.ReadQueues(f)
				f.Close()
				if err != nil {
					return fmt.Errorf("-f %s: %w", queuesFile, err)
				}
			}
			if addNodes != "" {
				if change.AddNodes, err = parseNodes(addNodes); err != nil {
					return fmt.Errorf("--add-nodes: %w", err)
				}
				change.NodeSlices = mockNodeSlices
			}
			change.RemoveNodes = removeNodes
			if flags != "" {
				cfg, err := whatif.ParseControllerFlags(flags, base)
				if err != nil {
					return err
				}
				change.Config = &cfg
			}
			var st *decide.Snapshot
			if from != "" {
				f, err := os.Open(from)
				if err != nil {
					return err
				}
				st, err = snapshot.Load(f)
				f.Close()
				if err != nil {
					return fmt.Errorf("--from %s: %w", from, err)
				}
			} else {
				c, _, err := o.reader()
				if err != nil {
					return err
				}
				if st, err = snapshot.Read(ctx, c, snapshot.Options{}); err != nil {
					return err
				}
			}
			res, err := whatif.Run(ctx, st, base, change)
			if err != nil {
				return err
			}
			res.Print(s.Out, all)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&queuesFile, "filename", "f", "", "Queues (YAML stream or List) that replace the cluster's queues of the same name, or are added.")
	f.StringVar(&from, "from", "", "Run on a saved snapshot (kubectl tessera snapshot) instead of the cluster.")
	f.StringVar(&addNodes, "add-nodes", "", "Add nodes of mock profiles, <count>x<profile> separated by ';' or ',' (e.g. 4xdgxh100, 2xh100-80gb:8); each publishes exactly the kubelet plugin's slices for the profile.")
	f.StringSliceVar(&removeNodes, "remove-node", nil, "Remove a node (repeatable): its slices, and the pods bound to it (their claims lose their allocations).")
	f.StringVar(&flags, "controller-flags", "", "Controller flags after the change, in the controller's syntax: --reclaim, --max-reclaims-per-cycle, --kubernetes-version, --scheduler-feature-gates.")
	f.StringVar(&before, "current-controller-flags", "", "The flags the running controller has (the same four), if not its defaults.")
	f.StringVar(&version, "kubernetes-version", "", "Kubernetes version whose scheduler defaults both runs use (default: the engine's, the newest supported).")
	f.BoolVar(&all, "all", false, "Also list every workload's outcome after the change.")
	return cmd
}

// parseNodes reads --add-nodes: "<count>x<profile>" groups separated by
// ";" or ",", e.g. 4xdgxh100 (the simulator's syntax).
func parseNodes(s string) ([]whatif.NodeGroup, error) {
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

// mockNodeSlices are the ResourceSlices the kubelet plugin publishes for a
// node of the mock profile, seeded with the node's name, with its default
// flags (pkg/node/plugin's TestMockProfileIsThePlugins).
func mockNodeSlices(ctx context.Context, profile, node string) ([]*resourceapi.ResourceSlice, error) {
	n, err := nodeslices.MockProfile(ctx, profile, node)
	if err != nil {
		return nil, fmt.Errorf("mock profile %q: %w", profile, err)
	}
	return n.Slices, nil
}
