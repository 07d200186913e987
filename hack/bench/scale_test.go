package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/test/scale"
)

func TestScaleSectionSurvivesMakeBench(t *testing.T) {
	section := scaleBegin + "\n## Scale\nfigures\n" + scaleEnd + "\n"
	tests := []struct {
		name, doc, want string
	}{
		{"appended to a report without one", "# Benchmarks\n\nbody\n", "# Benchmarks\n\nbody\n\n" + section},
		{"replaces the old one in place", "# B\n\n" + scaleBegin + "\nold\n" + scaleEnd + "\n\n## After\n", "# B\n\n" + strings.TrimRight(section, "\n") + "\n\n## After\n"},
		{"an empty report", "", "\n\n" + section},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := spliceScale(tc.doc, section); got != tc.want {
				t.Errorf("spliceScale() =\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
	// make bench rewrites the report and carries the section over.
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	if got := keptScale(path); got != "" {
		t.Errorf("keptScale of a missing report = %q, want nothing", got)
	}
	if err := os.WriteFile(path, []byte(spliceScale("# Benchmarks\nold body\n", section)), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := keptScale(path); got != section {
		t.Errorf("keptScale() = %q, want %q", got, section)
	}
}

func TestShortFunc(t *testing.T) {
	for in, want := range map[string]string{
		"k8s.io/dynamic-resource-allocation/structured/internal/experimental.(*Allocator).Allocate": "experimental.(*Allocator).Allocate",
		"runtime.mallocgc":                    "runtime.mallocgc",
		"encoding/json.(*decodeState).object": "json.(*decodeState).object",
		"k8s.io/api/core/v1.(*Pod).Unmarshal": "v1.(*Pod).Unmarshal",
		"main.main.func1":                     "main.main.func1",
	} {
		if got := shortFunc(in); got != want {
			t.Errorf("shortFunc(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMIGRatios(t *testing.T) {
	run := func(name string, pods int, bound time.Duration, schedCPU time.Duration) *scale.Result {
		return &scale.Result{Name: name, Pods: pods, AllBound: bound, Usage: map[string]scale.Usage{"kube-scheduler": {CPU: schedCPU}}}
	}
	for _, tc := range []struct {
		name string
		runs []*scale.Result
		want []string
	}{
		{"no MIG run", []*scale.Result{run(scale.MIGSharesName, 100, time.Second, time.Second)}, nil},
		{"MIG against shares", []*scale.Result{run(scale.MIGSharesName, 100, 10*time.Second, time.Second), run(scale.MIGName, 100, 20*time.Second, 3*time.Second)},
			[]string{"| **2.00x** | 20.0 s vs 10.0 s |", "| 0.50x | 5.0 vs 10.0 pods/s |", "| 3.00x | 30.00 ms vs 10.00 ms |"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows := strings.Join(migRatios(&scale.Report{Runs: tc.runs}), "\n")
			if len(tc.want) == 0 && rows != "" {
				t.Errorf("rows %q, want none", rows)
			}
			for _, w := range tc.want {
				if !strings.Contains(rows, w) {
					t.Errorf("rows\n%s\nlack %q", rows, w)
				}
			}
		})
	}
	if migSetup(scale.Config{}) != "" || !strings.Contains(migSetup(scale.Small()), "100 pods") {
		t.Errorf("setup sentence: %q / %q", migSetup(scale.Config{}), migSetup(scale.Small()))
	}
}
