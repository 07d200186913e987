package commands

import (
	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/pkg/control/snapshot"
)

// reader is a client for the flags' cluster that knows Tessera's kinds.
func (o *Options) reader() (client.Client, string, error) {
	cfg, ns, err := o.ClientConfig()
	if err != nil {
		return nil, "", err
	}
	c, err := client.New(cfg, client.Options{Scheme: snapshot.Scheme()})
	return c, ns, err
}

func newSnapshotCommand(o *Options, s Streams) *cobra.Command {
	return &cobra.Command{
		Use:   "snapshot",
		Short: "Save what the admission controller decides on, as YAML",
		Long: `Writes the state one admission cycle reads (queues, queued pods, claims,
claim templates, ResourceSlices, DeviceClasses, nodes, managed namespaces,
DeviceTaintRules; all namespaces) to standard output as a multi-document
YAML stream. "kubectl tessera what-if --from FILE" runs on it offline.

It holds pod specs and claim specs of every queued workload: treat the file
like the cluster's own data.`,
		Example: `  kubectl tessera snapshot > state.yaml
  kubectl tessera what-if --from state.yaml -f new-queues.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := o.reader()
			if err != nil {
				return err
			}
			st, err := snapshot.Read(cmd.Context(), c, snapshot.Options{})
			if err != nil {
				return err
			}
			return snapshot.Write(s.Out, st)
		},
	}
}
