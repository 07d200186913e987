// Command bench runs Tessera's benchmarks and regenerates docs/benchmarks.md
// and the plots it links (make bench). Every figure is quoted next to a
// baseline measured in the same run, and the report says which command
// reproduces it.
//
//	go run ./hack/bench                    # full run (< 15 min on 2 cores)
//	go run ./hack/bench --short            # small trace, few iterations (make test)
//	go run ./hack/bench --short --cluster=without  # only what runs in process (make test's
//	                                       # first lane; --cluster=only: its cluster lane)
//	go run ./hack/bench --pod-start=off    # skip the local-cluster measurement
//	go run ./hack/bench --baseline-rev=REV # the engine's cost against REV (default: the code of
//	                                       # 2026-11-25), in the same run; empty: skip it
//	go run ./hack/bench --scale            # only the KWOK scale run (make bench-scale, < 30 min):
//	                                       # rewrites its own section of the report, keeps the rest
//	go run ./hack/bench --scale --scale-size large
//	                                       # 2,000 KWOK nodes, (b), (a') and (a) only (make
//	                                       # bench-scale-large): a section of its own
//	go run ./hack/bench --tuning           # only the settings against the defaults on KWOK nodes
//	                                       # (make bench-tuning, < 30 min): its section of docs/tuning.md
//
// make bench keeps the scale sections of the report it rewrites; the short
// run ends with the scale run's small variant (scale.Small).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/tessera-dev/tessera/hack/internal/docsection"
	"github.com/tessera-dev/tessera/hack/internal/machine"
	"github.com/tessera-dev/tessera/test/scale"
)

// target is one goal of the benchmarks and how this run did.
type target struct {
	what, goal, measured string
	// verdict is met, missed, reported (no target) or not measured.
	verdict string
}

// report is the document being written.
type report struct {
	short bool
	// baselineRev is the revision whose decision engine the admission
	// section measures next to this code's; empty: none.
	baselineRev string
	// dir is where the document goes; plots go to dir/img.
	dir     string
	body    bytes.Buffer
	targets []target
}

// iterations is the -benchtime of a Go benchmark: full, or short in the
// short run.
func (r *report) iterations(full, short string) string {
	if r.short {
		return short
	}
	return full
}

func (r *report) printf(format string, args ...any) { fmt.Fprintf(&r.body, format, args...) }

func (r *report) target(what, goal, measured string, met bool) {
	r.targets = append(r.targets, target{what: what, goal: goal, measured: measured, verdict: verdictOf(met)})
}

// verdictOf is the verdict of a target that was measured.
func verdictOf(met bool) string {
	if met {
		return "met"
	}
	return "**missed**"
}

func (r *report) unmeasured(what, goal, why string) {
	r.targets = append(r.targets, target{what: what, goal: goal, measured: why, verdict: "not measured"})
}

func main() {
	short := flag.Bool("short", false, "small traces and few iterations (make test): checks that every benchmark still runs, writes nothing")
	out := flag.String("out", "docs/benchmarks.md", "report to write (plots go to img/ next to it)")
	podStart := flag.String("pod-start", "auto", "pod start latency on the local cluster: on, off, or auto (on when root and the cluster binaries are built)")
	scaleOnly := flag.Bool("scale", false, "run only the end-to-end scale benchmark on KWOK nodes and rewrite its section of --out")
	scaleSize := flag.String("scale-size", "full", "size of the --scale or --tuning run: full (500 nodes, 4,000 pods; --tuning 1,000), small (the smoke variant) or large (--scale only: 2,000 nodes, (b), (a') and (a); its own section)")
	tuningOnly := flag.Bool("tuning", false, "run only the tuning benchmark on KWOK nodes (kube-scheduler's and Tessera's settings against the defaults) and rewrite its section of --out (default docs/tuning.md)")
	clusterSections := flag.String("cluster", "with", "sections that bring up the local cluster (pod start, the short run's scale smoke): with (run them too), without (skip them) or only (run nothing else); make test runs the two halves side by side")
	baselineRev := flag.String("baseline-rev", defaultBaselineRev, "revision whose decision engine the admission section benchmarks in the same run, from a temporary git worktree (empty: none; the short run skips it)")
	flag.Parse()
	// The scale harness uses a controller-runtime client.
	ctrllog.SetLogger(klog.Background())
	ctx := context.Background()
	start := time.Now()
	r := &report{short: *short, dir: filepath.Dir(*out), baselineRev: *baselineRev}
	if *tuningOnly {
		path := *out
		if !flagSet("out") {
			path = tuningDoc
		}
		if err := tuningMain(ctx, path, *scaleSize); err != nil {
			fail(err)
		}
		return
	}
	if *scaleOnly {
		cfg, doc := scale.Default(), scaleFull
		switch *scaleSize {
		case "small":
			cfg = scale.Small()
		case "large":
			cfg, doc = scale.Large(), scaleLarge
		}
		section, runErr := scaleSection(ctx, cfg, doc, r.dir, false)
		if section == "" {
			fail(runErr)
		}
		if err := doc.markers.Write(*out, section); err != nil {
			fail(err)
		}
		fmt.Fprintf(os.Stderr, "bench: wrote the scale section of %s in %s\n", *out, time.Since(start).Round(time.Second))
		if runErr != nil {
			fail(fmt.Errorf("the scale run stopped early (its section says so): %w", runErr))
		}
		return
	}

	type section struct {
		name    string
		cluster bool // brings up the local cluster
		run     func(context.Context, *report) error
	}
	sections := []section{
		{"packing", false, packing},
		{"prepare", false, prepareLatency},
		{"admission", false, admissionThroughput},
		{"publication", false, publication},
		{"controller memory", false, controllerMemory},
		{"usage sampling", false, usageSampling},
		{"pod start", true, func(ctx context.Context, r *report) error { return podStartLatency(ctx, r, *podStart) }},
	}
	if *short {
		sections = append(sections, section{"scale (small)", true, scaleSmoke})
	}
	switch *clusterSections {
	case "with", "without", "only":
	default:
		fail(fmt.Errorf("--cluster=%q: want with, without or only", *clusterSections))
	}
	if *clusterSections == "only" && !*short {
		fail(errors.New("--cluster=only writes a report without the in-process sections: use it with --short"))
	}
	failed := false
	for _, s := range sections {
		if (*clusterSections == "without" && s.cluster) || (*clusterSections == "only" && !s.cluster) {
			continue
		}
		fmt.Fprintf(os.Stderr, "bench: %s\n", s.name)
		if err := s.run(ctx, r); err != nil {
			// A broken benchmark is a failure (make test runs the short
			// version so that they cannot rot), but the others still run.
			fmt.Fprintf(os.Stderr, "bench: %s: %v\n", s.name, err)
			r.printf("\n**%s: failed in this run:**\n\n```\n%v\n```\n", s.name, err)
			failed = true
		}
	}

	var doc bytes.Buffer
	fmt.Fprintf(&doc, "# Benchmarks\n\n")
	fmt.Fprintf(&doc, "Generated by `make bench` (`go run ./hack/bench`, %s) on %s.\n\n", time.Since(start).Round(time.Second), time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&doc, "Machine: %s, %d cores, %s, load average %s at the start. ", machine.CPUModel(), runtime.NumCPU(), runtime.Version(), machine.LoadAverage())
	fmt.Fprintf(&doc, "These machines are noisy and shared: compare the ratios against baselines measured in the same run, not absolute times across runs. Each section names the command that reproduces it.\n\n")
	if r.short {
		fmt.Fprintf(&doc, "**Short run** (`--short`, part of `make test`): small traces and few iterations, to show that every benchmark still runs. Its figures, the p99s above all, are not the ones to quote.\n\n")
	}
	fmt.Fprintf(&doc, "## Targets\n\n| what | target | this run | |\n|---|---|---|---|\n")
	for _, t := range r.targets {
		fmt.Fprintf(&doc, "| %s | %s | %s | %s |\n", t.what, t.goal, t.measured, t.verdict)
	}
	doc.Write(r.body.Bytes())
	for _, m := range docsection.Kept {
		if kept := m.Kept(*out); kept != "" && !*short {
			fmt.Fprintf(&doc, "\n%s", kept)
		}
	}

	if *short {
		fmt.Print(doc.String())
	} else {
		if err := os.WriteFile(*out, doc.Bytes(), 0o644); err != nil {
			fail(err)
		}
		fmt.Fprintf(os.Stderr, "bench: wrote %s in %s\n", *out, time.Since(start).Round(time.Second))
	}
	if failed {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}
