package main

import (
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
