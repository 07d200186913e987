// Command kubelet-plugin is Tessera's DRA kubelet plugin for driver
// gpu.tessera.dev. See --help and docs/.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/cli"
	"github.com/tessera-dev/tessera/pkg/featuregates"
	"github.com/tessera-dev/tessera/pkg/node/mps"
	"github.com/tessera-dev/tessera/pkg/node/plugin"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == mps.DaemonCommand {
		os.Exit(mpsDaemon(os.Args[2:]))
	}
	var opts plugin.Options
	fs := pflag.NewFlagSet("kubelet-plugin", pflag.ContinueOnError)
	opts.AddFlags(fs)
	gates := featuregates.New(featuregates.Plugin())
	opts.Gates = gates
	if code, ok := cli.Parse(fs, gates, "Tessera's DRA kubelet plugin for driver gpu.tessera.dev: discovers GPUs, publishes\nResourceSlices and prepares claims into per-claim CDI specs.", os.Args[1:], os.Stderr); !ok {
		os.Exit(code)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)
	cli.SetMemoryLimit(ctx)

	var err error
	switch {
	case opts.Probe != "":
		err = plugin.Probe(ctx, opts.HealthcheckSocket, opts.Probe)
	case opts.PrintSlices:
		err = plugin.PrintSlices(ctx, &opts, os.Stdout)
	default:
		err = plugin.Run(ctx, &opts)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-plugin: %v\n", err)
		klog.Flush()
		os.Exit(1)
	}
}

// mpsDaemon is the main process of a claim's MPS daemon pod (see package
// mpspod).
func mpsDaemon(args []string) int {
	d, err := mps.ParseDaemon(args, os.Environ(), os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-plugin %s: %v\n", mps.DaemonCommand, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	if err := d.Run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-plugin %s: %v\n", mps.DaemonCommand, err)
		klog.Flush()
		return 1
	}
	klog.Flush()
	return 0
}
