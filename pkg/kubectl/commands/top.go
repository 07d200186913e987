package commands

import (
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/kubectl/top"
)

func newTopCommand(o *Options, s Streams) *cobra.Command {
	var (
		by, sortBy string
		all        bool
	)
	cmd := &cobra.Command{
		Use:   "top [claims]",
		Short: "Claims' allocated vs used GPU memory, sorted by waste",
		Long: `Lists Tessera's claims: GPU memory allocated, used by their processes (the
kubelet plugin's last sample, updated when it moves by max(64Mi, 5%)),
used/allocated, SM utilization and waste (allocated but unused), per claim
or summed per namespace, queue or node. Claims not sampled yet show "-"
and sort last.`,
		Example: `  kubectl tessera top -A
  kubectl tessera top --by queue -A --sort used`,
		Args:      cobra.MatchAll(cobra.MaximumNArgs(1), cobra.OnlyValidArgs),
		ValidArgs: []string{"claims"},
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, namespace, err := o.Clientset()
			if err != nil {
				return err
			}
			if all {
				namespace = metav1.NamespaceAll
			}
			ctx := cmd.Context()
			claims, err := client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			podList, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			pods := map[string]*corev1.Pod{}
			for i := range podList.Items {
				p := &podList.Items[i]
				pods[p.Namespace+"/"+p.Name] = p
			}
			rows, err := top.Group(top.Claims(claims.Items, pods, devicemodel.DriverName), by)
			if err != nil {
				return err
			}
			if err := top.Sort(rows, sortBy); err != nil {
				return err
			}
			return top.Print(s.Out, rows, by)
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&all, "all-namespaces", "A", false, "Claims of every namespace.")
	f.StringVar(&by, "by", top.ByClaim, "One row per claim, or summed per namespace, queue or node.")
	f.StringVar(&sortBy, "sort", top.SortWaste, "Largest first by waste, used or allocated.")
	return cmd
}
