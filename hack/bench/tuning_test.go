package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
		tuningBegin, tuningEnd, "Small run", "`percentageOfNodesToScore` changes nothing", "stopped early**: score100, shares: timed out",
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

func TestWriteSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tuning.md")
	doc := "# Tuning\n\n## Before\n\n" + tuningBegin + "\nold\n" + tuningEnd + "\n\n## After\n"
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	section := tuningBegin + "\nnew\n" + tuningEnd + "\n"
	if err := writeSection(path, tuningBegin, tuningEnd, section); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	if want := "# Tuning\n\n## Before\n\n" + tuningBegin + "\nnew\n" + tuningEnd + "\n\n## After\n"; string(got) != want {
		t.Errorf("document =\n%q\nwant\n%q", got, want)
	}
	missing := filepath.Join(t.TempDir(), "new.md")
	if err := writeSection(missing, tuningBegin, tuningEnd, section); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(missing); string(got) != "\n\n"+section {
		t.Errorf("a new document = %q", got)
	}
}
