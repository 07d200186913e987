// Command controller is Tessera's queue controller: hierarchical queues with
// GPU-memory quotas, fair share, gang admission checked against the
// scheduler's own allocator, reclaim, and the webhooks that gate queued
// pods and validate Queues. See --help and docs/controller.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/tessera-dev/tessera/pkg/cli"
	"github.com/tessera-dev/tessera/pkg/control/controller"
	"github.com/tessera-dev/tessera/pkg/featuregates"
)

func main() {
	var opts controller.Options
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	opts.AddFlags(fs)
	gates := featuregates.New(featuregates.Controller())
	opts.Gates = gates
	if code, ok := cli.Parse(fs, gates, "Tessera's queue controller: admits pods labelled tessera.dev/queue by queue quota, fair\nshare and an all-or-nothing simulation of their claims with the scheduler's allocator.", os.Args[1:], os.Stderr); !ok {
		os.Exit(code)
	}
	opts.Complete(fs.Changed)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)
	cli.SetMemoryLimit(ctx)
	ctrl.SetLogger(logger) // controller-runtime's packages log through it
	if err := run(ctx, opts); err != nil {
		fmt.Fprintf(os.Stderr, "controller: %v\n", err)
		klog.Flush()
		os.Exit(1)
	}
}

func run(ctx context.Context, opts controller.Options) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	var (
		cfg *rest.Config
		err error
	)
	if opts.Kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("API server configuration (set --kubeconfig outside a cluster): %w", err)
	}
	cfg.QPS, cfg.Burst = opts.KubeAPIQPS, opts.KubeAPIBurst
	cfg.UserAgent = "tessera-controller"
	if opts.CheckInstall {
		return controller.CheckInstall(ctx, cfg, opts, os.Stdout)
	}
	return controller.Run(ctx, cfg, opts)
}
