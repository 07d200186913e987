package main

import (
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/hack/internal/docsection"
	"github.com/tessera-dev/tessera/test/scale"
)

func TestTuningSection(t *testing.T) {
	settings := []scale.Setting{
		{Name: scale.DefaultSetting, Knob: "defaults", Value: "-", Scheduler: scale.LiftedScheduler(), Workloads: []string{"claims", "shares"}},
		{Name: "score100", Knob: "score", Value: "100", Scheduler: scale.SchedulerTuning{PercentageOfNodesToScore: 100, QPS: 5000, Burst: 10000}, Workloads: []string{"claims", "shares"}},
		{Name: "default-again", Knob: "defaults again", Value: "-", Scheduler: scale.LiftedScheduler(), Workloads: []string{"claims"}},
	}
	result := func(setting, w string, bound time.Duration, schedCPU time.Duration) *scale.Result {
		return &scale.Result{Name: scale.TuningName(setting, w), Pods: 100, AllBound: bound,
			Usage: map[string]scale.Usage{"kube-scheduler": {CPU: schedCPU}}}
	}
	rep := &scale.Report{Config: scale.TuningConfig(true), GPUsPerNode: 8, Runs: []*scale.Result{
		result("default", "claims", 10*time.Second, time.Second),
		result("default", "shares", 5*time.Second, time.Second),
		result("score100", "claims", 20*time.Second, 3*time.Second),
		result("default-again", "claims", 8*time.Second, time.Second),
	}}
	rep.Failed = "score100, shares: timed out"
	got := tuningSection(rep, settings, runMeta{took: time.Minute, date: "2026-11-27", cpu: "cpu", cores: 2, load: "1 2 3", small: true})
	for _, want := range []string{
		docsection.BenchTuning.Begin, docsection.BenchTuning.End, "Small run", "`percentageOfNodesToScore` changes nothing", "stopped early**: score100, shares: timed out",
		// 20 s against 10 s (default) and 8 s (again); 3 s of CPU / 100 pods.
		"| score | 100 | KubeSchedulerConfiguration `percentageOfNodesToScore: 100` | (a') no queue | 20.0 s | 5.0 | 30.00 ms | 0.00 ms | **2.00x** / **2.50x** |",
		"| defaults | - | - | (a) 4 queues | 5.0 s | 20.0 | 10.00 ms | 0.00 ms | **1.00x** / - |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("section lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "| score | 100 | KubeSchedulerConfiguration `percentageOfNodesToScore: 100` | (a) ") {
		t.Errorf("a workload not measured has a row:\n%s", got)
	}
}
