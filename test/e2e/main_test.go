//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"testing"

	"github.com/tessera-dev/tessera/test/localcluster"
)

// cluster is the one local cluster all tests share.
var cluster *localcluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "e2e: the local cluster (kubelet, containerd) needs root")
		return 1
	}
	// An interrupt during bring-up cancels it (Up then tears down what it
	// started); one while tests run tears the cluster down and exits.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu      sync.Mutex
		running *localcluster.Cluster
	)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "e2e: %v: tearing the cluster down\n", s)
		cancel()
		mu.Lock()
		c := running
		mu.Unlock()
		if c != nil {
			_ = c.Down()
			os.Exit(130)
		}
	}()
	opts := localcluster.Options{
		Install:    localcluster.InstallMode(os.Getenv("TESSERA_INSTALL")), // "": chart
		Profile:    os.Getenv("TESSERA_PROFILE"),
		Plugin:     localcluster.PluginMode(os.Getenv("TESSERA_PLUGIN")),
		Controller: os.Getenv("TESSERA_START_CONTROLLER") == "1",
	}
	c, err := localcluster.Up(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: bringing the local cluster up failed: %v\n", err)
		if h, herr := localcluster.New(opts); herr == nil {
			fmt.Fprint(os.Stderr, h.LogTails(40))
		}
		return 1
	}
	cluster = c
	mu.Lock()
	running = c
	mu.Unlock()

	// The network rule: the only image must already be in containerd before
	// the first pod exists, so nothing is ever pulled.
	code := 0
	images := []string{localcluster.BusyboxImage}
	if c.ChartMode() && c.PluginRunning() {
		images = append(images, localcluster.TesseraImage)
	}
	for _, img := range images {
		if ok, err := c.ImagePresent(context.Background(), img); err != nil || !ok {
			fmt.Fprintf(os.Stderr, "e2e: %s is not in containerd before any pod was created (err %v)\n", img, err)
			code = 1
		}
	}
	if code == 0 {
		fmt.Fprintf(os.Stderr, "e2e: Tessera installed in mode %s (TESSERA_INSTALL=chart|host)\n", c.Opts.Install)
		code = m.Run()
	}

	if code != 0 {
		if dir, err := c.ArchiveLogs("e2e-failed"); err == nil {
			fmt.Fprintf(os.Stderr, "e2e: component logs archived in %s\n", dir)
		}
		fmt.Fprint(os.Stderr, c.LogTails(60))
	}
	if os.Getenv("TESSERA_E2E_KEEP") == "1" {
		fmt.Fprintf(os.Stderr, "e2e: TESSERA_E2E_KEEP=1: cluster left running (kubeconfig %s); `go run ./hack/localcluster down` stops it\n", c.Kubeconfig)
		return code
	}
	mu.Lock()
	running = nil // from here on the teardown below is the only one
	mu.Unlock()
	if err := c.Down(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: teardown: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
