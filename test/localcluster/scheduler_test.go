package localcluster

import (
	"slices"
	"testing"
)

func TestMergeArgs(t *testing.T) {
	base := []string{"--kubeconfig=/k", "--leader-elect=false", "--feature-gates=A=true,B=true", "--v=1"}
	for _, tc := range []struct {
		name  string
		extra []string
		want  []string
	}{
		{"nothing", nil, base},
		{"a new flag is appended", []string{"--config=/c.yaml"},
			[]string{"--kubeconfig=/k", "--leader-elect=false", "--feature-gates=A=true,B=true", "--v=1", "--config=/c.yaml"}},
		{"a flag present is replaced", []string{"--v=4", "--kubeconfig=/other"},
			[]string{"--kubeconfig=/other", "--leader-elect=false", "--feature-gates=A=true,B=true", "--v=4"}},
		{"gates are added to base's", []string{"--feature-gates=SchedulerPreQueueingHints=true"},
			[]string{"--kubeconfig=/k", "--leader-elect=false", "--feature-gates=A=true,B=true,SchedulerPreQueueingHints=true", "--v=1"}},
		{"a gate in both takes extra's value", []string{"--feature-gates=B=false, C=true"},
			[]string{"--kubeconfig=/k", "--leader-elect=false", "--feature-gates=A=true,B=false,C=true", "--v=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := mergeArgs(base, tc.extra); !slices.Equal(got, tc.want) {
				t.Errorf("mergeArgs(%v) =\n %v\nwant\n %v", tc.extra, got, tc.want)
			}
		})
	}
	if base[2] != "--feature-gates=A=true,B=true" {
		t.Errorf("mergeArgs changed its base: %v", base)
	}
}

// TestSchedulerArgs: the cluster's kube-scheduler keeps Options.ComponentArgs
// under a restart's extra arguments, and the cluster's feature gates under
// an extra gate.
func TestSchedulerArgs(t *testing.T) {
	c, err := New(Options{WorkDir: t.TempDir(), ComponentArgs: map[string][]string{compScheduler: {"--kube-api-qps=5000"}}})
	if err != nil {
		t.Fatal(err)
	}
	got := c.schedulerArgs([]string{"--config=/c.yaml", "--feature-gates=SchedulerPreQueueingHints=true"})
	for _, want := range []string{"--kube-api-qps=5000", "--config=/c.yaml", "--kubeconfig=" + c.SchedulerKubeconfig(),
		"--feature-gates=" + featureGateFlag() + ",SchedulerPreQueueingHints=true"} {
		if !slices.Contains(got, want) {
			t.Errorf("schedulerArgs lacks %q: %v", want, got)
		}
	}
}
