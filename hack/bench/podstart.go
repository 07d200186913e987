package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/tessera-dev/tessera/test/localcluster"
)

// podStartResult is what TestPodStartLatency writes.
type podStartResult struct {
	Pods          int     `json:"pods"`
	PlainMedianMs float64 `json:"plainMedianMs"`
	ClaimMedianMs float64 `json:"claimMedianMs"`
	WholeMedianMs float64 `json:"wholeMedianMs"`
	PlainP90Ms    float64 `json:"plainP90Ms"`
	ClaimP90Ms    float64 `json:"claimP90Ms"`
	WholeP90Ms    float64 `json:"wholeP90Ms"`
	Ratio         float64 `json:"ratio"`
	WholeRatio    float64 `json:"wholeRatio"`
}

const podStartCommand = "go test -tags e2e -count=1 -run '^TestPodStartLatency$' ./test/e2e/ -v"

// podStartLatency runs the e2e test TestPodStartLatency on a real local
// cluster (kube-apiserver, scheduler, controller-manager, kubelet,
// containerd; Tessera installed by its Helm chart).
func podStartLatency(ctx context.Context, r *report, mode string) error {
	what, goal := "Pod start, share claim vs no claim (median of 20)", "ratio (no target)"
	r.printf("\n## Pod start latency on the local cluster\n\n")
	r.printf("The e2e test `TestPodStartLatency` on the real single-node cluster of [local-cluster.md](local-cluster.md) (kube-apiserver, kube-scheduler, kube-controller-manager, kubelet, containerd; Tessera installed by its Helm chart on mock T4s with the fixture driver root): 20 pods without a claim, 20 with a 512Mi share claim and 20 with a whole-GPU claim, one at a time and interleaved, each from the create call to Running seen through a watch. A share and a whole GPU get the same CDI edits (the driver's files and createContainer hooks), so share ÷ whole GPU is what a share costs beyond any claim; each whole-GPU pod is deleted before the next starts.\n\nCommand: `TESSERA_E2E_RESULTS=<dir> %s`\n\n", podStartCommand)
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
	r.printf("| %d with a 512Mi share claim | %.0f ms | %.0f ms |\n", p.Pods, p.ClaimMedianMs, p.ClaimP90Ms)
	r.printf("| %d with a whole-GPU claim | %.0f ms | %.0f ms |\n\n", p.Pods, p.WholeMedianMs, p.WholeP90Ms)
	r.printf("Ratios of medians: share claim / no claim **%.2fx**; share claim / whole-GPU claim **%.2fx**. The difference to no claim is the claim's path: the resourceclaim controller creates the claim from the template, the scheduler allocates it, the kubelet calls NodePrepareResources and containerd applies the CDI spec, whose hooks run at every container start.\n", p.Ratio, p.WholeRatio)
	r.targets = append(r.targets,
		target{what: what, goal: goal, measured: fmt.Sprintf("%.0f ms vs %.0f ms: %.2fx", p.ClaimMedianMs, p.PlainMedianMs, p.Ratio), verdict: "reported"},
		target{what: "Pod start, share claim vs whole-GPU claim (median of 20)", goal: goal, measured: fmt.Sprintf("%.0f ms vs %.0f ms: %.2fx", p.ClaimMedianMs, p.WholeMedianMs, p.WholeRatio), verdict: "reported"})
	return createContainerHooks(r)
}

// createContainerHooks times each nvidia-cdi-hook createContainer hook of a
// claim's spec on a container root (BenchmarkCreateContainerHooks).
func createContainerHooks(r *report) error {
	g := goBenchRun{pkg: "./pkg/node/driverfiles/", pattern: "CreateContainerHooks", benchtime: "20x"}
	res, err := g.run()
	if err != nil {
		return err
	}
	r.printf("\nEach createContainer hook the runtime runs at every container start of a claim (share, whole GPU, time slice or MIG alike), timed on a container root with the fixture driver's files (the real `nvidia-cdi-hook`, a process each). Hooks that need a real container (`enable-cuda-compat`, `disable-device-node-modification`, `update-application-profile`) are not timed here. A cluster whose images do not need a hook can leave it out with `--disabled-cdi-hooks` (docs/enforcement.md#the-drivers-edits).\n\nCommand: `%s` (as root)\n\n| hook | time per run |\n|---|---:|\n", g.command())
	names := make([]string, 0, len(res))
	for name := range res {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		r.printf("| `%s` | %.1f ms |\n", strings.TrimPrefix(name, "CreateContainerHooks/"), res[name].Figures["ns/op"]/1e6)
	}
	return nil
}
