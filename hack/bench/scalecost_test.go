package main

import (
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/test/scale"
)

func TestCostTargets(t *testing.T) {
	usage := func(api, ctrl time.Duration, ctrlRSS, schedRSS uint64) map[string]scale.Usage {
		return map[string]scale.Usage{"kube-apiserver": {CPU: api}, "controller": {CPU: ctrl, PeakRSS: ctrlRSS}, "kube-scheduler": {CPU: time.Second, PeakRSS: schedRSS}}
	}
	shares := &scale.Result{Name: "shares", Pods: 1000, APIWrites: 11900, Usage: usage(42*time.Second, 5*time.Second, 0, 0)}
	claims := &scale.Result{Name: "claims", Pods: 1000, APIWrites: 11000, Usage: usage(40*time.Second, 0, 0, 0)}
	base := &scale.Result{Name: scale.MIGSharesName, Pods: 100, Usage: usage(0, 0, 200<<20, 400<<20)}
	mig := &scale.Result{Name: scale.MIGName, Pods: 100, Usage: usage(0, 0, 600<<20, 1600<<20)}
	for _, tc := range []struct {
		name string
		rep  scale.Report
		want []string
	}{
		{"nothing measured", scale.Report{}, nil},
		{"writes and API CPU", scale.Report{Runs: []*scale.Result{shares, claims}}, []string{
			"| API writes per admitted pod in (a) beyond (a'), all clients: at most 1.0 | +0.90 (11.90 vs 11.00 per pod) | met |",
			"| API server CPU per pod, (a) ÷ (a'): at most 1.05x | 1.05x (42.00 ms vs 40.00 ms) | met |",
		}},
		{"the run's time, Kueue's start apart", scale.Report{Total: 33 * time.Minute, PeerStart: 12 * time.Minute}, []string{
			"| 21m0s (+ 12m0s starting Kueue) | met |",
		}},
		{"a run over its time", scale.Report{Total: 31 * time.Minute, PeerStart: 3 * time.Second}, []string{
			"| 30m57s (+ 3s starting Kueue) | **missed** |",
		}},
		{"memory per device and against the scheduler", scale.Report{Config: scale.Config{Nodes: 100}, DevicesPerNode: 8, MIGDevicesPerNode: 208,
			Runs: []*scale.Result{base, mig}}, []string{
			// 400 MiB more over 20,000 more devices: 20,972 B each.
			"| 20972 B (peak 600 MiB vs 200 MiB) | **missed** |",
			"(20000 more devices: 208 per node instead of 8)",
			"| 0.38x (600 MiB vs 1600 MiB) | met |",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows := strings.Join(costTargets(&tc.rep, 30*time.Minute), "\n")
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
}

// TestNoRunTimeTarget: a run without a time target (the large one) gets
// no row for it.
func TestNoRunTimeTarget(t *testing.T) {
	if rows := costTargets(&scale.Report{Total: 40 * time.Minute}, 0); len(rows) != 0 {
		t.Errorf("rows %q, want none", rows)
	}
}

func TestZeroCostBound(t *testing.T) {
	run := func(api, ctrl, sched time.Duration) *scale.Result {
		return &scale.Result{Pods: 1000, Usage: map[string]scale.Usage{"kube-apiserver": {CPU: api}, "controller": {CPU: ctrl}, "kube-scheduler": {CPU: sched}}}
	}
	// (a'): 100 s of CPU; (a): 90 s, of which the controller 10 s and the
	// API server 10 s beyond (a')'s: 70 s without Tessera's cost, 0.70x.
	if got := zeroCostBound(run(50*time.Second, 10*time.Second, 30*time.Second), run(40*time.Second, 0, 60*time.Second)); got < 0.699 || got > 0.701 {
		t.Errorf("bound %.3f, want 0.70", got)
	}
	if got := zeroCostBound(nil, run(1, 1, 1)); got != 0 {
		t.Errorf("bound without (a): %v, want 0", got)
	}
}
