package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/tessera-dev/tessera/test/localcluster"
)

// podStartResult is what TestPodStartLatency writes.
type podStartResult struct {
	Pods          int     `json:"pods"`
	PlainMedianMs float64 `json:"plainMedianMs"`
	ClaimMedianMs float64 `json:"claimMedianMs"`
	PlainP90Ms    float64 `json:"plainP90Ms"`
	ClaimP90Ms    float64 `json:"claimP90Ms"`
	Ratio         float64 `json:"ratio"`
}

const podStartCommand = "go test -tags e2e -count=1 -run '^TestPodStartLatency$' ./test/e2e/ -v"

// podStartLatency runs the e2e test TestPodStartLatency on a real local
// cluster (kube-apiserver, scheduler, controller-manager, kubelet,
// containerd; Tessera installed by its Helm chart).
func podStartLatency(ctx context.Context, r *report, mode string) error {
	what, goal := "Pod start, share claim vs no claim (median of 20)", "ratio (no target)"
	r.printf("\n## Pod start latency on the local cluster\n\n")
	r.printf("The e2e test `TestPodStartLatency` on the real single-node cluster of [local-cluster.md](local-cluster.md) (kube-apiserver, kube-scheduler, kube-controller-manager, kubelet, containerd; Tessera installed by its Helm chart on mock T4s): 20 pods with a 512Mi share claim and 20 without, one at a time and interleaved, each from the create call to Running seen through a watch.\n\nCommand: `TESSERA_E2E_RESULTS=<dir> %s`\n\n", podStartCommand)
	var why string
	switch {
	case mode == "off":
		why = "skipped (--pod-start=off)"
	case r.short:
		why = "skipped in the short run"
	case mode == "auto" && os.Geteuid() != 0:
		why = "needs root"
	case mode == "auto" && !localcluster.BinariesCached():
		why = "the cluster binaries are not built (`make cluster-build`, about 12 minutes cold)"
	}
	if why != "" {
		r.printf("Not measured in this run: %s.\n", why)
		r.unmeasured(what, goal, why)
		return nil
	}
	dir, err := os.MkdirTemp("", "tessera-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, "go", "test", "-tags", "e2e", "-count=1", "-run", "^TestPodStartLatency$", "./test/e2e/", "-v", "-timeout", "20m")
	cmd.Env = append(os.Environ(), "TESSERA_E2E_RESULTS="+dir, "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	fmt.Fprintf(os.Stderr, "bench: %s\n", podStartCommand)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", podStartCommand, err, tail(string(out), 30))
	}
	data, err := os.ReadFile(filepath.Join(dir, "pod-start-latency.json"))
	if err != nil {
		return fmt.Errorf("TestPodStartLatency wrote no results: %w", err)
	}
	var p podStartResult
	if err := json.Unmarshal(data, &p); err != nil {
		return fmt.Errorf("pod-start-latency.json: %w", err)
	}
	r.printf("| pods | median | p90 |\n|---|---:|---:|\n")
	r.printf("| %d without a claim (baseline) | %.0f ms | %.0f ms |\n", p.Pods, p.PlainMedianMs, p.PlainP90Ms)
	r.printf("| %d with a 512Mi share claim | %.0f ms | %.0f ms |\n\n", p.Pods, p.ClaimMedianMs, p.ClaimP90Ms)
	r.printf("Ratio of medians, share claim / no claim: **%.2fx**. The difference is the claim's path: the resourceclaim controller creates the claim from the template, the scheduler allocates it, the kubelet calls NodePrepareResources and containerd applies the CDI spec.\n", p.Ratio)
	r.targets = append(r.targets, target{what: what, goal: goal, measured: fmt.Sprintf("%.0f ms vs %.0f ms: %.2fx", p.ClaimMedianMs, p.PlainMedianMs, p.Ratio), verdict: "reported"})
	return nil
}
