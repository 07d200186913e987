// Package commands is the kubectl plugin's command tree (`kubectl
// tessera <command>`): one cobra command per file, each with its own
// --help; an unknown command fails naming it. cmd/kubectl-tessera only runs
// it.
package commands

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Streams are where commands write.
type Streams struct {
	Out, Err io.Writer
}

// Options are the flags every command shares: which cluster and namespace.
type Options struct {
	Kubeconfig, Context, Namespace string
}

// ClientConfig loads the kubeconfig the flags name and the namespace to
// use (the flag, else the context's).
func (o *Options) ClientConfig() (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.Kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.Context})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", err
	}
	ns := o.Namespace
	if ns == "" {
		if ns, _, err = cc.Namespace(); err != nil {
			return nil, "", err
		}
	}
	return cfg, ns, nil
}

// Clientset is a typed client for the flags' cluster.
func (o *Options) Clientset() (kubernetes.Interface, string, error) {
	cfg, ns, err := o.ClientConfig()
	if err != nil {
		return nil, "", err
	}
	c, err := kubernetes.NewForConfig(cfg)
	return c, ns, err
}

// NewRootCommand is `kubectl tessera` with every command.
func NewRootCommand(s Streams) *cobra.Command {
	o := &Options{}
	root := &cobra.Command{
		Use:         "kubectl-tessera",
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl tessera"},
		Short:       "Tessera's view of GPU claims and queues",
		Long: `kubectl tessera: Tessera's view of the cluster's GPU claims and queues.

Install the binary on your PATH as kubectl-tessera and run it as
"kubectl tessera <command>".`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// Without a command: the help, and a failure. (No Args validator:
		// cobra's default for a root with commands refuses an unknown one
		// by name, before --help is looked at.)
		RunE: func(cmd *cobra.Command, _ []string) error {
			_ = cmd.Help()
			return fmt.Errorf("no command given: use one of %s", commandNames(cmd))
		},
	}
	root.SetOut(s.Out)
	root.SetErr(s.Err)
	pf := root.PersistentFlags()
	pf.StringVar(&o.Kubeconfig, "kubeconfig", "", "Path to the kubeconfig file (default: $KUBECONFIG or ~/.kube/config).")
	pf.StringVar(&o.Context, "context", "", "The kubeconfig context to use.")
	pf.StringVarP(&o.Namespace, "namespace", "n", "", "Namespace (default: the context's).")
	root.AddCommand(newTopCommand(o, s))
	root.AddCommand(newReportCommand(o, s))
	root.AddCommand(newWhatIfCommand(o, s))
	root.AddCommand(newSnapshotCommand(o, s))
	root.AddCommand(newShadowCommand(o, s))
	// An unknown command names itself (cobra's own message lists
	// suggestions); so does an unknown flag.
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%s: %w (see %s --help)", cmd.CommandPath(), err, cmd.CommandPath())
	})
	return root
}

func commandNames(cmd *cobra.Command) string {
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	return fmt.Sprint(names)
}
