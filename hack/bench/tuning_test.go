package main

import (
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/hack/internal/docsection"
	"github.com/tessera-dev/tessera/test/scale"
)

func TestTuningSection(t *testing.T) {
	both := []string{"claims", "shares"}
	settings := []scale.Setting{
		{Name: "default", Knob: "defaults, first", Value: "-", Scheduler: scale.LiftedScheduler(), Workloads: both, Baseline: true},
		{Name: "score100", Knob: "score", Value: "100", Scheduler: scale.SchedulerTuning{PercentageOfNodesToScore: 100, QPS: 5000, Burst: 10000}, Workloads: both},
		{Name: "score10", Knob: "score", Value: "10", Scheduler: scale.SchedulerTuning{PercentageOfNodesToScore: 10, QPS: 5000, Burst: 10000}, Workloads: both},
		{Name: "default-again", Knob: "defaults, last", Value: "-", Scheduler: scale.LiftedScheduler(), Workloads: both, Baseline: true},
	}
	result := func(setting, w string, bound time.Duration, schedCPU time.Duration) *scale.Result {
		return &scale.Result{Name: scale.TuningName(setting, w), Pods: 100, AllBound: bound,
			Usage: map[string]scale.Usage{"kube-scheduler": {CPU: schedCPU}}}
	}
	rep := &scale.Report{Config: scale.TuningConfig(true), GPUsPerNode: 8, Runs: []*scale.Result{
		result("default", "claims", 10*time.Second, time.Second),
		result("default", "shares", 5*time.Second, time.Second),
		result("score100", "claims", 20*time.Second, 3*time.Second),
		result("score100", "shares", 7*time.Second, time.Second),
		result("score10", "claims", 9*time.Second, time.Second),
		result("default-again", "claims", 8*time.Second, time.Second),
	}}
	rep.Failed = "score10, shares: timed out"
	got := tuningSection(rep, settings, runMeta{took: time.Minute, date: "2026-11-27", cpu: "cpu", cores: 2, load: "1 2 3", small: true})
	for _, want := range []string{
		docsection.BenchTuning.Begin, docsection.BenchTuning.End, "Small run", "`percentageOfNodesToScore` changes nothing", "stopped early**: score10, shares: timed out",
		"The defaults, (a') no queue: all bound in 10.0 s, 8.0 s (median 9.0 s, range 8.0 s to 10.0 s).",
		// 20 s against the median of 10 s and 8 s; 3 s of CPU / 100 pods.
		"| score | 100 | KubeSchedulerConfiguration `percentageOfNodesToScore: 100` | (a') no queue | 20.0 s | 5.0 | 30.00 ms | 0.00 ms | **2.22x** | **slower**: beyond twice the defaults' spread |",
		"| score | 10 | KubeSchedulerConfiguration `percentageOfNodesToScore: 10` | (a') no queue | 9.0 s | 11.1 | 10.00 ms | 0.00 ms | **1.00x** | none shown: within the defaults' range |",
		"| defaults, first | - | - | (a') no queue | 10.0 s | 10.0 | 10.00 ms | 0.00 ms | **1.11x** | baseline |",
		// The shares' defaults ran once: no range to judge against.
		"The defaults, (a) 4 queues: all bound in 5.0 s (measured once: no range).",
		"| score | 100 | KubeSchedulerConfiguration `percentageOfNodesToScore: 100` | (a) 4 queues | 7.0 s | 14.3 | 10.00 ms | 0.00 ms | **1.40x** | cannot tell: the defaults were measured once |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("section lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "| score | 10 | KubeSchedulerConfiguration `percentageOfNodesToScore: 10` | (a) ") {
		t.Errorf("a workload not measured has a row:\n%s", got)
	}
}

func TestBaselineEffect(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name     string
		times    []time.Duration
		d        time.Duration
		baseline bool
		want     string
	}{
		// Median 11 s, spread 1 s: an effect beyond 9 s and 13 s.
		{"far below", []time.Duration{10 * s, 12 * s, 11 * s}, 8 * s, false, "**faster**"},
		{"far above", []time.Duration{10 * s, 12 * s, 11 * s}, 14 * s, false, "**slower**"},
		{"just below", []time.Duration{10 * s, 12 * s, 11 * s}, 9 * s, false, "perhaps faster"},
		{"just above", []time.Duration{10 * s, 12 * s, 11 * s}, 13 * s, false, "perhaps slower"},
		{"on its edge", []time.Duration{10 * s, 12 * s, 11 * s}, 12 * s, false, "none shown"},
		{"lopsided spread", []time.Duration{10 * s, 11 * s, 16 * s}, 8 * s, false, "perhaps faster"},
		{"one default", []time.Duration{10 * s}, 30 * s, false, "cannot tell"},
		{"a default itself", []time.Duration{10 * s, 12 * s}, 10 * s, true, "baseline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := &scale.Report{}
			var settings []scale.Setting
			for i, d := range tc.times {
				name := "default" + strings.Repeat("x", i)
				settings = append(settings, scale.Setting{Name: name, Baseline: true})
				rep.Runs = append(rep.Runs, &scale.Result{Name: scale.TuningName(name, "claims"), AllBound: d})
			}
			b := baselineOf(rep, settings, "claims")
			if got := b.effect(tc.d, tc.baseline); !strings.Contains(got, tc.want) {
				t.Errorf("effect(%v) over %v = %q, want %q", tc.d, tc.times, got, tc.want)
			}
			if b.min > b.median || b.median > b.max {
				t.Errorf("min %v, median %v, max %v out of order", b.min, b.median, b.max)
			}
		})
	}
}
