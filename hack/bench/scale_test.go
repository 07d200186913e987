package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/test/scale"
)

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

func TestCPUBudget(t *testing.T) {
	run := func(name string, bound time.Duration, api, other time.Duration) *scale.Result {
		return &scale.Result{Name: name, Title: name, Pods: 1000, AllBound: bound,
			Usage: map[string]scale.Usage{"kube-apiserver": {CPU: api}, "kube-scheduler": {CPU: other}}}
	}
	var doc strings.Builder
	p := func(f string, args ...any) { fmt.Fprintf(&doc, f, args...) }
	writeCPUBudget(p, &scale.Report{Runs: []*scale.Result{run("plain", time.Second, 0, 0)}}, 2)
	if doc.Len() != 0 {
		t.Errorf("wrote %q without (a) and (a')", doc.String())
	}
	// (a'): 100 ms per pod in all over 50 s; (a): 75 ms per pod over 40 s.
	writeCPUBudget(p, &scale.Report{Runs: []*scale.Result{run("claims", 50*time.Second, 40*time.Second, 60*time.Second), run("shares", 40*time.Second, 45*time.Second, 30*time.Second)}}, 2)
	for _, want := range []string{
		"| claims | 100.0 | 100.0 ms | 2.00 of 2 | 40.0 ms | 60.0 ms |",
		"| shares | 75.0 | 75.0 ms | 1.88 of 2 | 45.0 ms | 30.0 ms |",
		"**0.75x** (time: 0.80x)",
		"may use 60.0 ms of CPU per pod in all; the API server alone used 45.0 ms per pod in (a), which leaves 15.0 ms for everything else (it used 30.0 ms)",
	} {
		if !strings.Contains(doc.String(), want) {
			t.Errorf("%s\nlacks %q", doc.String(), want)
		}
	}
}
