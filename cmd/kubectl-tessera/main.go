// Command kubectl-tessera is a kubectl plugin (`kubectl tessera top`):
// Tessera's claims with the GPU memory they were allocated and what their
// processes really use, per claim or summed per namespace, queue or node,
// sorted by waste. Install it on your PATH as kubectl-tessera.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tessera-dev/tessera/pkg/devicemodel"
	"github.com/tessera-dev/tessera/pkg/top"
)

const usage = `Usage: kubectl tessera top [claims] [flags]

Lists Tessera's claims: GPU memory allocated, used by their processes (the
kubelet plugin's last sample, updated when it moves by max(64Mi, 5%%)),
used/allocated, SM utilization and waste (allocated but unused). Claims not
sampled yet show "-" and sort last.

Flags:
%s`

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "kubectl tessera: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("kubectl-tessera", pflag.ContinueOnError)
	var (
		kubeconfig, kubeContext, namespace, by, sortBy string
		all                                            bool
	)
	fs.StringVar(&kubeconfig, "kubeconfig", "", "Path to the kubeconfig file (default: $KUBECONFIG or ~/.kube/config).")
	fs.StringVar(&kubeContext, "context", "", "The kubeconfig context to use.")
	fs.StringVarP(&namespace, "namespace", "n", "", "Namespace (default: the context's).")
	fs.BoolVarP(&all, "all-namespaces", "A", false, "Claims of every namespace.")
	fs.StringVar(&by, "by", top.ByClaim, "One row per claim, or summed per namespace, queue or node.")
	fs.StringVar(&sortBy, "sort", top.SortWaste, "Largest first by waste, used or allocated.")
	fs.Usage = func() { fmt.Fprintf(os.Stderr, usage, fs.FlagUsages()) }
	if err := fs.Parse(args); err != nil {
		if err == pflag.ErrHelp {
			return nil
		}
		return err
	}
	rest := fs.Args()
	if len(rest) == 0 || rest[0] != "top" || len(rest) > 2 || (len(rest) == 2 && rest[1] != "claims") {
		fs.Usage()
		return fmt.Errorf("unknown command %q: the command is `top`", strings.Join(rest, " "))
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return err
	}
	if namespace == "" && !all {
		if namespace, _, err = cc.Namespace(); err != nil {
			return err
		}
	}
	if all {
		namespace = metav1.NamespaceAll
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
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
	return top.Print(os.Stdout, rows, by)
}
