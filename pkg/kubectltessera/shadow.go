package kubectltessera

import (
	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/pkg/whatif"
)

func newShadowCommand(o *Options, s Streams) *cobra.Command {
	var (
		name  string
		limit int
	)
	cmd := &cobra.Command{
		Use:   "shadow",
		Short: "Where a shadow controller's decisions differ from the active one's",
		Long: `Reads the report a shadow controller (controller --shadow; the chart's
shadow.enabled) keeps in its ConfigMap and prints it as a diff, newest
first: per difference, what the shadow would do (+) and what the active
controller did (-). Kinds: would-admit (the shadow admitted what the active
controller still holds), would-hold (the active controller admitted what the
shadow holds), would-reclaim, would-keep (the active controller evicted what
the shadow keeps), other-reason (both hold it, for different reasons).`,
		Example: `  kubectl tessera shadow -n tessera-system
  kubectl tessera shadow -n tessera-system --limit 0`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, ns, err := o.Clientset()
			if err != nil {
				return err
			}
			cm, err := c.CoreV1().ConfigMaps(ns).Get(cmd.Context(), name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			r, err := whatif.ParseShadowReport(cm.Data)
			if err != nil {
				return err
			}
			r.Print(s.Out, limit)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "report", "tessera-shadow-report", "The shadow's report ConfigMap (its --shadow-report), in --namespace.")
	cmd.Flags().IntVar(&limit, "limit", 50, "Differences to print, newest first; 0 prints all the report keeps.")
	return cmd
}
