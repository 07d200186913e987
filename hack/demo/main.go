// Command demo is `make demo`: on a fresh machine it builds what is missing,
// brings up the local cluster (test/localcluster: upstream Kubernetes 1.37,
// containerd, on 127.0.0.1), installs Tessera's Helm chart with mock GPUs
// (the image is built and imported without Docker; --install host runs the
// plugin and controller as host processes instead) and runs the scenarios
// in demo/ one by one, telling what is created, where
// each claim landed (read from the claims' allocation through the API) and
// what each container sees (its environment, from its log). After each
// scenario it deletes the pods and checks their claims were unprepared;
// at the end it tears the cluster down, or with --keep leaves it running
// and prints how to use kubectl against it.
//
//	go run ./hack/demo [--keep] [--only showdown,mig] [--list] [--install chart|host]
//
// It needs root (kubelet, containerd, mounts).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/test/helm"
	"github.com/tessera-dev/tessera/test/imagebuild"
	"github.com/tessera-dev/tessera/test/localcluster"
	"github.com/tessera-dev/tessera/test/scenario"
)

const rule = "━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━"

func main() {
	keep := flag.Bool("keep", false, "leave the cluster running at the end (and on failure) and print how to use kubectl against it")
	only := flag.String("only", "", "comma-separated scenarios to run (default: all; see --list)")
	list := flag.Bool("list", false, "list the scenarios and exit")
	install := flag.String("install", string(localcluster.DefaultInstallMode()), "how Tessera runs: chart (the Helm chart deployments/helm/tessera; its image is built and imported without Docker) or host (host processes, faster to iterate on) (env TESSERA_INSTALL)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: go run ./hack/demo [--keep] [--only a,b] [--list] [--install chart|host]   (as root; or: make demo)\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	mode := localcluster.InstallMode(*install)
	if mode != localcluster.InstallChart && mode != localcluster.InstallHost {
		fmt.Fprintf(os.Stderr, "demo: --install must be chart or host, not %q\n", *install)
		os.Exit(2)
	}
	os.Exit(run(*keep, *only, *list, mode))
}

func say(format string, args ...any) { fmt.Printf(format+"\n", args...) }

func selected(repo, only string) ([]scenario.Scenario, error) {
	var out []scenario.Scenario
	if only == "" {
		for _, s := range scenario.Scenarios {
			if s.Optional && !s.Present(repo) {
				continue
			}
			out = append(out, s)
		}
		return out, nil
	}
	for _, name := range strings.Split(only, ",") {
		s, ok := scenario.Find(strings.TrimSpace(name))
		if !ok {
			var names []string
			for _, s := range scenario.Scenarios {
				names = append(names, s.Name)
			}
			return nil, fmt.Errorf("no scenario %q: use one of %s", name, strings.Join(names, ", "))
		}
		if !s.Present(repo) {
			return nil, fmt.Errorf("scenario %s: demo/%s has no YAML files yet", s.Name, s.Name)
		}
		out = append(out, s)
	}
	return out, nil
}

func run(keep bool, only string, list bool, mode localcluster.InstallMode) int {
	probe, err := localcluster.New(localcluster.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	repo := probe.Opts.RepoRoot
	if repo == "" {
		fmt.Fprintln(os.Stderr, "demo: run it inside the Tessera repository")
		return 1
	}
	scenarios, err := selected(repo, only)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 2
	}
	if list {
		for _, s := range scenario.Scenarios {
			state := ""
			if !s.Present(repo) {
				state = "  (not present yet)"
			}
			say("%-10s %s [plugin %s]%s", s.Name, s.Title, s.Plugin, state)
		}
		return 0
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: the local cluster runs a kubelet and containerd and needs root (sudo make demo)")
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	start := time.Now()

	say(rule)
	say("Tessera demo: a DRA driver for shareable GPUs on a real Kubernetes %s", localcluster.KubernetesVersion)
	say("  etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubelet and containerd run as host")
	say("  processes on 127.0.0.1 (no Docker, no registry); Tessera's kubelet plugin serves mock GPUs.")
	if mode == localcluster.InstallChart {
		say("  Tessera is installed with its Helm chart (deployments/helm/tessera, values/localcluster.yaml): the image")
		say("  is built without Docker and imported into containerd; each plugin configuration is a `helm upgrade`.")
	} else {
		say("  Tessera's kubelet plugin and controller run as host processes (--install host).")
	}
	say("  Scenarios: %s", names(scenarios))
	say(rule)
	if missing := missingBinaries(probe.Bin); len(missing) > 0 {
		say("First run: building %s from the Go module proxy into %s.", strings.Join(missing, ", "), localcluster.CacheDir())
		say("  A cold build takes about 25 minutes on 2 cores (progress every 30 s); later runs reuse the cache.")
	}

	// The plugin starts with each scenario's configuration (see runScenario).
	opts := localcluster.Options{
		Install:       mode,
		Plugin:        localcluster.PluginOff,
		KeepOnFailure: keep,
		Logf: func(format string, args ...any) {
			fmt.Printf("  [cluster %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
		},
	}
	say("\nBringing the cluster up (a teardown of any leftovers comes first)...")
	c, err := localcluster.Up(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo: bringing the cluster up failed: %v\n", err)
		if h, herr := localcluster.New(opts); herr == nil {
			fmt.Fprint(os.Stderr, h.LogTails(30))
		}
		return 1
	}
	env := &scenario.Env{Client: c.Client, Kubectl: c.Kubectl, RepoRoot: repo, Out: os.Stdout}

	failed := ""
	for i, s := range scenarios {
		if err := runScenario(ctx, c, env, s, i+1, len(scenarios)); err != nil {
			failed = s.Name
			if ctx.Err() != nil {
				fmt.Fprintf(os.Stderr, "\ndemo: interrupted during scenario %s\n", s.Name)
				break
			}
			fmt.Fprintf(os.Stderr, "\ndemo: scenario %s failed: %v\n", s.Name, err)
			break
		}
	}
	if failed != "" && ctx.Err() == nil {
		if dir, err := c.ArchiveLogs("demo-failed"); err == nil {
			fmt.Fprintf(os.Stderr, "demo: component logs archived in %s\n", dir)
		}
		fmt.Fprint(os.Stderr, c.LogTails(30))
	}
	if keep {
		printKeep(c, repo, scenarios[len(scenarios)-1], failed)
	} else {
		say("\nTearing the cluster down (no process, mount, cgroup, CDI spec or kubelet state is left)...")
		if err := c.Down(); err != nil {
			fmt.Fprintf(os.Stderr, "demo: teardown: %v\n", err)
			return 1
		}
	}
	if failed != "" {
		return 1
	}
	say("\n%s\nAll %d scenario(s) ran as described, in %s.", rule, len(scenarios), time.Since(start).Round(time.Second))
	if !keep {
		say("Run `make demo-cluster DEMO_ARGS=--keep` (or `go run ./hack/demo --keep`) to keep the cluster and try it with kubectl.")
	}
	return 0
}

func names(ss []scenario.Scenario) string {
	var n []string
	for _, s := range ss {
		n = append(n, s.Name)
	}
	return strings.Join(n, ", ")
}

func missingBinaries(b *localcluster.Binaries) []string {
	var out []string
	for _, p := range []struct{ name, path string }{
		{"Kubernetes " + localcluster.KubernetesVersion, b.Kubelet},
		{"etcd " + localcluster.EtcdVersion, b.Etcd},
		{"containerd " + localcluster.ContainerdVersion, b.Containerd},
	} {
		if _, err := os.Stat(p.path); err != nil {
			out = append(out, p.name)
		}
	}
	return out
}

func runScenario(ctx context.Context, c *localcluster.Cluster, env *scenario.Env, s scenario.Scenario, i, n int) error {
	say("\n%s\n%d/%d  %s — %s\n%s", rule, i, n, s.Name, s.Title, rule)
	story := s.Story
	if len(story) == 0 {
		story = readmeIntro(filepath.Join(s.Dir(env.RepoRoot), "README.md"))
	}
	for _, l := range story {
		say("  %s", l)
	}
	say("  (YAML and README: demo/%s/)", s.Name)
	if cur := c.Plugin(); !cur.Equal(s.Plugin) {
		how := ""
		if c.ChartMode() {
			how = " (helm upgrade --install)"
		}
		if cur.Profile == "" {
			say("\n  starting Tessera's kubelet plugin with %s%s", s.Plugin, how)
		} else {
			say("\n  restarting Tessera's kubelet plugin with %s (was %s)%s", s.Plugin, cur, how)
		}
		if err := c.WaitClaimsUnprepared(ctx, time.Minute); err != nil {
			return err
		}
		if err := c.StartPluginWith(ctx, s.Plugin); err != nil {
			return err
		}
	} else {
		say("\n  Tessera's kubelet plugin runs with %s", s.Plugin)
	}
	if devs, err := c.PublishedDevices(ctx); err == nil {
		say("  it publishes %d device(s): %s", len(devs), summarizeDevices(devs))
	}
	if s.Controller {
		if !imagebuild.HasGoSources(filepath.Join(env.RepoRoot, "cmd", "controller")) {
			say("  skipped: this scenario needs the controller (./cmd/controller), which has no sources yet")
			return nil
		}
		if c.ChartMode() {
			say("  enabling the Tessera controller in the release (helm upgrade; the plugin's pod stays)")
		} else {
			say("  starting the Tessera controller")
		}
		if err := c.StartController(ctx); err != nil {
			return err
		}
	}

	ns := "demo-" + s.Name
	if err := createNamespace(ctx, c, ns); err != nil {
		return err
	}
	say("")
	r := scenario.NewRun(env, s, ns)
	if err := r.Apply(ctx); err != nil {
		return err
	}
	pls, err := r.Placements(ctx)
	if err != nil {
		return err
	}
	r.Show(ctx, pls)
	checked, problems := scenario.Verify(pls)
	for _, c := range checked {
		say("  ✓ %s", c)
	}
	if len(problems) > 0 {
		return fmt.Errorf("what the containers see does not match the allocation:\n  %s", strings.Join(problems, "\n  "))
	}
	if s.After != nil {
		if err := s.After(ctx, r); err != nil {
			return err
		}
	}
	say("  cleaning up")
	if err := r.Cleanup(ctx, 2*time.Minute); err != nil {
		return err
	}
	_ = c.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	return nil
}

// summarizeDevices shortens a device list: gpu-0, gpu-0-ts-0..3 → counts
// per prefix when long.
func summarizeDevices(devs []string) string {
	if len(devs) <= 8 {
		return strings.Join(devs, ", ")
	}
	return strings.Join(devs[:6], ", ") + fmt.Sprintf(", … (%d more)", len(devs)-6)
}

func readmeIntro(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "#") {
			continue
		}
		if l == "" {
			if len(out) > 0 {
				break
			}
			continue
		}
		out = append(out, l)
	}
	return out
}

func createNamespace(ctx context.Context, c *localcluster.Cluster, ns string) error {
	// A namespace of that name left by an interrupted run is deleted first.
	if _, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err == nil {
		_ = c.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			if _, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				break
			}
		}
	}
	say("  $ kubectl create namespace %s", ns)
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	// Pods are rejected until the namespace's default ServiceAccount exists.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, err := c.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsNotFound(err) || time.Now().After(deadline) {
			return errors.Join(fmt.Errorf("waiting for ServiceAccount %s/default", ns), err)
		}
	}
}

func printKeep(c *localcluster.Cluster, repo string, last scenario.Scenario, failed string) {
	say("\n%s", rule)
	if failed != "" {
		say("--keep: the cluster stays up as it was when scenario %s failed, for inspection.", failed)
	} else {
		say("--keep: the cluster stays up. Tessera's kubelet plugin runs with %s (as scenario %s needs).", c.Plugin(), last.Name)
	}
	// Try the last scenario again by hand: its plugin configuration is the
	// one running.
	pod := "<pod>"
	if files, err := last.Files(repo); err == nil {
		for _, f := range files {
			ms, _ := scenario.ReadManifests(f)
			for _, m := range ms {
				if m.Kind == "Pod" && pod == "<pod>" {
					pod = m.Name
				}
			}
		}
	}
	say(`
  kubectl against it (the cluster's own kubectl and admin kubeconfig):
    export KUBECONFIG=%[1]s
    alias kubectl=%[2]s
    kubectl get resourceslices -o wide
    kubectl get deviceclasses
    kubectl create namespace try
    kubectl apply -n try -f demo/%[4]s/
    kubectl get resourceclaims -n try -o yaml     # status.allocation (device, shareID, consumedCapacity), status.devices
    kubectl logs -n try %[5]s
  or without exporting anything:
    go run ./hack/localcluster kubectl get pods -A
  logs of every component: %[3]s
  another scenario needs its own plugin configuration: go run ./hack/demo --only <scenario> --keep
  stop it and remove all its state:
    go run ./hack/localcluster down      (or: make cluster-down)`, c.Kubeconfig, c.Bin.Kubectl, c.Dirs.Logs, last.Name, pod)
	if c.ChartMode() {
		say(`  Tessera runs from its Helm chart (release tessera in tessera-system):
    kubectl get pods -n tessera-system
    kubectl logs -n tessera-system ds/tessera-kubelet-plugin
    %s status tessera -n tessera-system --kubeconfig %s`, helmPath(), c.Kubeconfig)
	}
}

// helmPath is the pinned helm the harness installs the chart with.
func helmPath() string {
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	return helm.BinaryPath()
}
