// Command localcluster brings Tessera's local single-node Kubernetes cluster
// up and down (see docs/local-cluster.md):
//
//	go run ./hack/localcluster up [--install chart|host] [--profile t4:2] [--plugin auto|on|off] [--controller] [--keep]
//	go run ./hack/localcluster down
//	go run ./hack/localcluster status
//	go run ./hack/localcluster kubectl get pods -A
//	go run ./hack/localcluster build      # only build/cache the binaries
//	go run ./hack/localcluster versions
//
// `up` returns once the cluster is ready and leaves it running; `down` stops
// it and removes its state. A ^C during `up` tears down what was started.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/tessera-dev/tessera/test/localcluster"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()

	cmd, args := os.Args[1], os.Args[2:]
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	workDir := fs.String("work-dir", localcluster.DefaultWorkDir(), "cluster work directory (logs, state)")
	install := fs.String("install", string(localcluster.DefaultInstallMode()), "how Tessera runs: chart (the Helm chart, image built and imported without Docker) or host (host processes; faster to iterate) (env TESSERA_INSTALL)")
	profile := fs.String("profile", envOr("TESSERA_PROFILE", localcluster.DefaultProfile), "mock GPU profile of the kubelet plugin (env TESSERA_PROFILE)")
	plugin := fs.String("plugin", envOr("TESSERA_PLUGIN", string(localcluster.PluginAuto)), "start the Tessera kubelet plugin: auto (when ./cmd/kubelet-plugin has sources), on, off (env TESSERA_PLUGIN)")
	controller := fs.Bool("controller", os.Getenv("TESSERA_START_CONTROLLER") == "1", "also start the controller: enabled in the chart, or ./cmd/controller as a host process (env TESSERA_START_CONTROLLER=1)")
	keep := fs.Bool("keep", false, "if bring-up fails, leave what started running for inspection instead of tearing it down")
	if cmd != "kubectl" {
		_ = fs.Parse(args)
	}
	opts := localcluster.Options{
		WorkDir:       *workDir,
		Install:       localcluster.InstallMode(*install),
		Plugin:        localcluster.PluginMode(*plugin),
		Profile:       *profile,
		Controller:    *controller,
		KeepOnFailure: *keep,
	}
	switch opts.Plugin {
	case localcluster.PluginAuto, localcluster.PluginOn, localcluster.PluginOff:
	default:
		fail(fmt.Errorf("--plugin must be auto, on or off, not %q", *plugin))
	}

	switch opts.Install {
	case localcluster.InstallChart, localcluster.InstallHost:
	default:
		fail(fmt.Errorf("--install must be chart or host, not %q", *install))
	}

	switch cmd {
	case "up":
		c, err := localcluster.Up(ctx, opts)
		if err != nil {
			fail(err)
		}
		fmt.Printf("cluster is up; it keeps running until `go run ./hack/localcluster down`\n")
		fmt.Printf("  kubeconfig: %s\n  kubectl:    %s\n  logs:       %s\n", c.Kubeconfig, c.Bin.Kubectl, c.Dirs.Logs)
		if c.ChartMode() {
			fmt.Printf("  Tessera:    Helm release %s in %s (install mode chart; --install host runs host processes)\n", "tessera", localcluster.ChartNamespace)
		} else {
			fmt.Printf("  Tessera:    host processes (install mode host)\n")
		}
	case "down":
		c, err := localcluster.New(opts)
		if err != nil {
			fail(err)
		}
		if err := c.Down(); err != nil {
			fail(err)
		}
	case "status":
		c, err := localcluster.New(opts)
		if err != nil {
			fail(err)
		}
		fmt.Println(c.StatusJSON())
	case "kubectl":
		c, err := localcluster.New(opts)
		if err != nil {
			fail(err)
		}
		out, err := c.Kubectl(ctx, args...)
		fmt.Print(out)
		if err != nil {
			os.Exit(1)
		}
	case "build":
		if _, err := localcluster.EnsureBinaries(ctx, func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }); err != nil {
			fail(err)
		}
	case "versions":
		fmt.Printf("kubernetes %s (staging %s)\netcd %s\ncontainerd %s\n", localcluster.KubernetesVersion,
			localcluster.KubernetesStagingVersion, localcluster.EtcdVersion, localcluster.ContainerdVersion)
		fmt.Printf("cache: %s\n", localcluster.CacheDir())
	default:
		usage()
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "localcluster: %v\n", err)
	os.Exit(1)
}

func usage() {
	fmt.Fprintln(os.Stderr, strings.TrimSpace(`
usage: go run ./hack/localcluster <command> [flags]
  up        build what is missing, tear down leftovers, bring the cluster up and leave it running
  down      stop everything and remove all cluster state (logs stay)
  status    show components, PIDs and paths
  kubectl   run the cluster's kubectl with the admin kubeconfig
  build     only build the pinned binaries into the cache
  versions  print the pinned versions
flags (up): --install chart|host  --profile t4:2  --plugin auto|on|off  --controller  --keep  --work-dir DIR`))
	os.Exit(2)
}
