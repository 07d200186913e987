package commands

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-dev/tessera/pkg/control/shadow"
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
			data, err := shadowReport(cmd.Context(), c, ns, name)
			if err != nil {
				return err
			}
			r, err := shadow.Parse(data)
			if err != nil {
				return err
			}
			r.Print(s.Out, limit)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "report", "", "The shadow's report ConfigMap (its --shadow-report), in --namespace; default: the one ConfigMap there labelled "+shadowReportLabel+".")
	cmd.Flags().IntVar(&limit, "limit", 50, "Differences to print, newest first; 0 prints all the report keeps.")
	return cmd
}

// shadowReportLabel marks the shadow's report ConfigMap (the controller
// sets it when it creates the report).
const shadowReportLabel = "app.kubernetes.io/component=shadow-report"

// shadowReport is the report's data: the named ConfigMap, else the one
// labelled as a shadow report in the namespace.
func shadowReport(ctx context.Context, c kubernetes.Interface, ns, name string) (map[string]string, error) {
	if name != "" {
		cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return cm.Data, nil
	}
	l, err := c.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: shadowReportLabel})
	if err != nil {
		return nil, err
	}
	switch len(l.Items) {
	case 0:
		return nil, fmt.Errorf("no shadow report in namespace %s (is a shadow controller running there? -n names the namespace, --report the ConfigMap)", ns)
	case 1:
		return l.Items[0].Data, nil
	default:
		var names []string
		for _, cm := range l.Items {
			names = append(names, cm.Name)
		}
		return nil, fmt.Errorf("several shadow reports in namespace %s: name one with --report (%v)", ns, names)
	}
}
