// Command kubelet-plugin is Tessera's DRA kubelet plugin for driver
// gpu.tessera.dev. See --help and docs/.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/plugin"
)

func main() {
	var opts plugin.Options
	fs := pflag.NewFlagSet("kubelet-plugin", pflag.ContinueOnError)
	opts.AddFlags(fs)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: kubelet-plugin [flags]\n\nTessera's DRA kubelet plugin for driver gpu.tessera.dev: discovers GPUs, publishes\nResourceSlices and prepares claims into per-claim CDI specs.\n\nFlags:\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == pflag.ErrHelp {
			os.Exit(0)
		}
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)

	var err error
	if opts.PrintSlices {
		err = plugin.PrintSlices(ctx, &opts, os.Stdout)
	} else {
		err = plugin.Run(ctx, &opts)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-plugin: %v\n", err)
		klog.Flush()
		os.Exit(1)
	}
}
