// Command benchupstream runs kube-scheduler's own benchmark (scheduler_perf of
// k8s.io/kubernetes) with upstream's DRA test driver slices, Tessera's slice
// shape and plain pods, and writes its section of docs/benchmarks.md
// (make bench-upstream). See hack/benchupstream/schedperf.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/tessera-dev/tessera/hack/benchupstream/schedperf"
	"github.com/tessera-dev/tessera/hack/internal/docsection"
	"github.com/tessera-dev/tessera/hack/internal/machine"
	"github.com/tessera-dev/tessera/test/localcluster"
)

func main() {
	def := schedperf.Config{Profile: "dgxh100", Share: "8Gi", Nodes: 500, InitPods: 2500, MeasurePods: 2500}
	cfg := def
	out := flag.String("out", "docs/benchmarks.md", "report whose bench-upstream section is rewritten")
	flag.StringVar(&cfg.Profile, "profile", def.Profile, "mock GPU profile of every node in Tessera's case")
	flag.StringVar(&cfg.Share, "share", def.Share, "GPU memory each Tessera claim asks for")
	flag.IntVar(&cfg.Nodes, "nodes", def.Nodes, "nodes of every case")
	flag.IntVar(&cfg.InitPods, "init-pods", def.InitPods, "claims (DRA cases) or pods (plain case) placed before the measurement")
	flag.IntVar(&cfg.MeasurePods, "measure-pods", def.MeasurePods, "pods whose scheduling is measured, per case")
	timeout := flag.Duration("timeout", 25*time.Minute, "limit for the benchmark process")
	note := flag.String("note", "", "a sentence the section states in bold (e.g. why the size is reduced)")
	flag.Parse()

	ctx := context.Background()
	start := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[bench-upstream %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	run := schedperf.Run{
		Config: cfg, Machine: fmt.Sprintf("%s, %d cores", machine.CPUModel(), runtime.NumCPU()), GoVersion: runtime.Version(),
		LoadAverage: machine.LoadAverage(), EtcdVersion: localcluster.EtcdVersion, Command: command(cfg, def), Note: *note,
	}
	if err := cfg.Validate(); err != nil {
		fail(err)
	}
	etcd, err := localcluster.EnsureEtcd(ctx, localcluster.Logf(logf))
	if err != nil {
		fail(err)
	}
	tree, err := schedperf.Prepare(ctx, logf, localcluster.CacheDir())
	if err != nil {
		fail(err)
	}
	files, err := schedperf.Generate(ctx, cfg)
	if err != nil {
		fail(err)
	}
	if err := os.RemoveAll(filepath.Join(tree, schedperf.PackageDir)); err != nil {
		fail(err)
	}
	for p, data := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(tree, p)), 0o755); err != nil {
			fail(err)
		}
		if err := os.WriteFile(filepath.Join(tree, p), data, 0o644); err != nil {
			fail(err)
		}
	}

	work := filepath.Join(tree, "_output", "bench-upstream")
	if err := os.RemoveAll(work); err != nil {
		fail(err)
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		fail(err)
	}
	bin := filepath.Join(work, "scheduler_perf_tessera.test")
	logf("compiling scheduler_perf with the generated package (cold: most of k8s.io/kubernetes; see the section for how long it took)")
	t := time.Now()
	build := exec.CommandContext(ctx, "go", "test", "-c", "-vet=off", "-o", bin, "./"+schedperf.PackageDir)
	build.Dir, build.Stdout, build.Stderr = tree, os.Stderr, os.Stderr
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	if err := build.Run(); err != nil {
		fail(fmt.Errorf("compiling %s: %w", schedperf.PackageDir, err))
	}
	run.Build = time.Since(t)
	logf("compiled in %s; running %s, %s and %s (%d nodes, %d + %d pods each; log in %s)", run.Build.Round(time.Second),
		schedperf.CaseUpstream, schedperf.CaseTessera, schedperf.CasePlain, cfg.Nodes, cfg.InitPods, cfg.MeasurePods, work)
	t = time.Now()
	if err := bench(ctx, bin, filepath.Join(tree, schedperf.PackageDir), work, etcd, *timeout); err != nil {
		fail(err)
	}
	run.Bench = time.Since(t)
	resultsFile, err := schedperf.ResultsFile(work)
	if err != nil {
		fail(err)
	}
	data, err := os.ReadFile(resultsFile)
	if err != nil {
		fail(err)
	}
	if run.Results, err = schedperf.ParseResults(data); err != nil {
		fail(fmt.Errorf("%s: %w", resultsFile, err))
	}
	run.Wall = time.Since(start)
	run.Date = time.Now().UTC().Format("2006-01-02")
	if err := docsection.BenchUpstream.Write(*out, schedperf.Section(run)); err != nil {
		fail(err)
	}
	for _, c := range []string{schedperf.CaseUpstream, schedperf.CaseTessera, schedperf.CasePlain} {
		logf("%s: %.1f pods/s", c, run.Results[c].Average)
	}
	if ratio, ok := run.Cost(); ok {
		logf("cost of Tessera's shape: %.2fx (target <= %.1fx)", ratio, schedperf.TargetRatio)
	}
	logf("wrote the bench-upstream section of %s in %s", *out, run.Wall.Round(time.Second))
}

// bench runs the compiled benchmark in the package directory (where its
// template paths resolve) with the cached etcd first in PATH, writing the
// results file and the logs into work.
func bench(ctx context.Context, bin, pkgDir, work, etcd string, timeout time.Duration) error {
	logFile, err := os.Create(filepath.Join(work, "bench.log"))
	if err != nil {
		return err
	}
	defer func() { _ = logFile.Close() }()
	ctx, cancel := context.WithTimeout(ctx, timeout+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin,
		"-test.run=^$", "-test.bench=^BenchmarkPerfScheduling$", "-test.benchtime=1x", "-test.short=false",
		"-test.timeout="+timeout.String(), "-perf-scheduling-label-filter="+schedperf.Label, "-data-items-dir="+work)
	cmd.Dir, cmd.Stdout, cmd.Stderr = pkgDir, logFile, logFile
	cmd.Env = append(os.Environ(),
		"PATH="+filepath.Dir(etcd)+string(os.PathListSeparator)+os.Getenv("PATH"),
		// What scheduler_perf's README runs benchmarks with.
		"KUBE_CACHE_MUTATION_DETECTOR=false", "ETCD_LOGLEVEL=warn", "ARTIFACTS="+work)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("scheduler_perf failed (%w); the end of %s:\n%s", err, logFile.Name(), tail(logFile.Name(), 40))
	}
	return nil
}

func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// command is the make command line that reproduces a run of cfg.
func command(cfg, def schedperf.Config) string {
	c := "make bench-upstream"
	var args []string
	if cfg.Profile != def.Profile {
		args = append(args, "--profile="+cfg.Profile)
	}
	if cfg.Share != def.Share {
		args = append(args, "--share="+cfg.Share)
	}
	if cfg.Nodes != def.Nodes {
		args = append(args, fmt.Sprintf("--nodes=%d", cfg.Nodes))
	}
	if cfg.InitPods != def.InitPods {
		args = append(args, fmt.Sprintf("--init-pods=%d", cfg.InitPods))
	}
	if cfg.MeasurePods != def.MeasurePods {
		args = append(args, fmt.Sprintf("--measure-pods=%d", cfg.MeasurePods))
	}
	if len(args) > 0 {
		c += " BENCH_UPSTREAM_ARGS='" + strings.Join(args, " ") + "'"
	}
	return c
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench-upstream:", err)
	os.Exit(1)
}
