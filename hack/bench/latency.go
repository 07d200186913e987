package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// admissionThroughput runs the controller's admission benchmarks, in
// rounds interleaved with the same benchmarks of the baseline revision.
func admissionThroughput(_ context.Context, r *report) error {
	n, rounds := r.iterations("2x", "1x"), 2
	if r.short {
		rounds = 1
	}
	g := goBenchRun{pkg: "./pkg/control/decide/", pattern: enginePattern, benchtime: n}
	r.printf("\n## Admission\n\n")
	r.printf("The controller's decision cycle in process (`pkg/control/decide`, no API server): queues, labelled pods, claims and templates, the shipped DeviceClasses, and ResourceSlices of simulated nodes published exactly as the kubelet plugin publishes them (one `dgxh100` node, 8 x H100 80GB, built by `nvmlmock` → `discover` → `devicemodel` → `publish`, copied under 1,000 node names). Each iteration is one full cycle from a fresh engine: build the queue tree and the device catalog, charge what runs, fair share, order, check limits and quota, simulate every workload's claims with the scheduler's allocator, decide.\n\n")
	r.printf("- **Admission**: 1,000 queues (10 departments x 99 teams; each team quota 80Gi, limit 3200Gi), 1,000 nodes (8,000 GPUs), 10,000 pending pods: 7,000 single pods with memory shares of 10, 20 or 40Gi, 2,000 single pods with a whole GPU, 1,000 pods in 125 gangs of 8 (a whole GPU each): 9,125 workloads.\n")
	r.printf("- **AdmissionFullCluster**: the same 10,000 pending pods when every GPU is taken: nothing fits, every workload is simulated and told why it waits (reclaim tries bounded by `--max-reclaims-per-cycle`, 16).\n")
	r.printf("- **Gang512**: one gang of 512 pods (a whole GPU each) on the 1,000 nodes, the first 500 of them full.\n\n")
	base, why := r.openBaseline()
	defer base.close()
	switch {
	case base != nil:
		r.printf("Command, run %d times, each right after the same benchmarks of the baseline (below); the figures are the mean of the runs: `%s`\n\n", rounds, g.command())
	case rounds > 1:
		r.printf("Command, run %d times; the figures are the mean of the runs: `%s`\n\n", rounds, g.command())
	default:
		r.printf("Command: `%s`\n\n", g.command())
	}
	runs, err := runEngineRounds(g, base.bench(g), rounds, goBenchRun.run)
	if err != nil {
		return err
	}
	res := meanRounds(runs.cur)
	a, full, gang := res["Admission"].Figures, res["AdmissionFullCluster"].Figures, res["Gang512"].Figures
	sec := cycleTime
	r.printf("| benchmark | time per cycle | workloads decided per second | admitted | allocator calls |\n|---|---:|---:|---:|---:|\n")
	r.printf("| Admission: 10,000 pending pods, 1,000 queues, 1,000 x 8-GPU nodes | %s | **%.0f** | %.0f | %.0f |\n", sec(a["ns/op"]), a["workloads/s"], a["admitted"], a["allocator-calls"])
	r.printf("| AdmissionFullCluster: the same, every GPU taken | %s | %.0f | 0 | %.0f |\n", sec(full["ns/op"]), full["workloads/s"], full["allocator-calls"])
	r.printf("| Gang512: one 512-pod gang, half the nodes full | **%s** | - | 1 gang, 512 pods | %.0f |\n\n", sec(gang["ns/op"]), gang["allocator-calls"])
	r.printf("- The allocator runs per node over that node's slices and a per-node allocation state, and a failure of a claim set on a node is remembered until that node's state changes, so identical pods do not retry full nodes. The 512-pod gang tries the 500 full nodes once each, then places 8 members per node.\n")
	r.printf("- These are decisions only. Applying them costs API calls (one patch per ungated pod, a status patch and an event per pod whose reason changed), bounded by `--kube-api-qps` (default 200, burst 400, per resource type); the controller ungates first and explains at most `--max-reason-updates-per-cycle` (256) waiting pods per cycle.\n")
	r.printf("- For scale: KAI reports 4,000 single-GPU jobs on 500 simulated nodes in about 6.6 minutes and a 512-pod job placed in about 49 s; Kueue 15,000 workloads over 30 queues in about 351 s. Those are end to end with their schedulers; the figures here are the admission decision alone; [Scale end to end](#scale-end-to-end) has Tessera's whole path on 500 KWOK nodes.\n")
	r.target("Admission throughput (10,000 pods, 1,000 queues, 1,000 nodes)", ">= 1,000 workloads/s", fmt.Sprintf("%.0f workloads/s", a["workloads/s"]), a["workloads/s"] >= 1000)
	r.target("512-pod gang decision", "< 1 s", sec(gang["ns/op"]), gang["ns/op"] < 1e9)
	r.engineAgainstBaseline(g, base, why, runs)
	if err := migAdmission(r, sec); err != nil {
		return err
	}
	return decideScale(r, sec)
}

// openBaseline checks out the baseline revision for the admission
// section, or says why there is none: the short run skips it (make test
// does not pay for building a second tree), and a baseline that cannot be
// set up is reported, never the run's failure.
func (r *report) openBaseline() (*baselineTree, string) {
	switch {
	case r.short:
		return nil, "skipped in the short run (make test does not build a second tree)"
	case r.baselineRev == "":
		return nil, "skipped (--baseline-rev is empty)"
	}
	fmt.Fprintf(os.Stderr, "bench: baseline %s in a temporary git worktree\n", r.baselineRev)
	b, err := openBaseline("", r.baselineRev)
	if err != nil {
		return nil, "the baseline could not be checked out: " + err.Error()
	}
	return b, ""
}

// engineAgainstBaseline writes what the engine changes since the baseline
// cost, measured in this run, and its row of the targets table.
func (r *report) engineAgainstBaseline(g goBenchRun, base *baselineTree, why string, runs engineRuns) {
	what, goal := "Admission engine, this code vs "+cmp.Or(shortRev(r.baselineRev), "a baseline")+" (same run)", "reported (no target)"
	if base == nil {
		r.printf("\nThe engine against the baseline (`--baseline-rev`, default the code of 2026-11-25): %s.\n", why)
		r.unmeasured(what, goal, firstLine(why))
		return
	}
	what = "Admission engine, this code vs " + base.short + " (same run)"
	r.printf("\n### This code vs %s, same run\n\n", base.label())
	r.printf("The same three benchmarks at %s, from a temporary `git worktree` of that revision (its engine was in `%s`), in the order baseline, this code, baseline, this code, so that both share the machine's noise: `--baseline-rev` (default %s, the last commit of 2026-11-25, before the engine changes of 2026-11-27 to 29). *Speed* is the baseline's time per cycle ÷ this code's: below 1.00x this code is slower.\n\n", base.label(), base.pkg, shortRev(defaultBaselineRev))
	r.printf("Command: `%s`\n\n", base.command(g))
	if runs.baseErr != nil {
		r.printf("Not measured: the baseline's benchmarks failed in this run (this code's figures above stand):\n\n```\n%v\n```\n", runs.baseErr)
		r.unmeasured(what, goal, "the baseline failed: "+firstLine(runs.baseErr.Error()))
		return
	}
	r.printf("%s\n", engineComparison(base.label(), runs))
	r.printf("- No target: the changes since then are features that add work to a cycle (DeviceTaintRules applied to the slices, charges that follow claims, a workload whose claims fail made inadmissible with a fault instead of failing the cycle, reclaim that waits for ended pods' claims) as well as changes to its speed, and no bound was set on what they may cost. The row in the targets table states the ratio measured in this run; a few iterations per benchmark on a shared machine are noisy, and the *each round* column shows how much.\n")
	r.targets = append(r.targets, engineTarget(what, runs))
}

// decideScale shows how a decision cycle's cost grows with the cluster:
// the Admission benchmark's 10,000 pods on 500 to 10,000 nodes (shares)
// and on 500 to 5,000 nodes in dynamic MIG mode (1g.10gb each). The
// short run takes the smallest size only.
func decideScale(r *report, sec func(float64) string) error {
	pattern := "DecideScale"
	if r.short {
		pattern = "DecideScale(MIG)?$/^nodes=500$"
	}
	g := goBenchRun{pkg: "./pkg/control/decide/", pattern: pattern, benchtime: "1x"}
	r.printf("\n### Decision cycle by cluster size\n\n")
	r.printf("The 10,000 pending pods of *Admission* (1,000 queues) on 500 to 10,000 copies of the 8 x H100 node: with memory shares and whole GPUs, and on nodes in dynamic MIG mode (200 devices per node) with every pod asking the smallest MIG device (1g.10gb), as the scale run's (m) workload does. *First*: from a fresh engine (a controller's first cycle after a start); *next*: the engine of the previous cycle with the same slices (every later cycle). Memory is what the cycle allocates (`-benchmem`), not what the engine keeps. One iteration per row, on a machine shared with other work: compare the rows of one run.\n\n")
	r.printf("Command: `%s -benchmem`\n\n", g.command())
	res, err := g.run()
	if err != nil {
		return err
	}
	r.printf("| nodes | devices | pods asking | cycle | time | admitted | allocated per cycle | allocations |\n|---:|---:|---|---|---:|---:|---:|---:|\n")
	var names []string
	for name := range res {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		mi, mj := strings.HasPrefix(names[i], "DecideScaleMIG/"), strings.HasPrefix(names[j], "DecideScaleMIG/")
		if mi != mj {
			return !mi
		}
		ni, nj := nodesOf(names[i]), nodesOf(names[j])
		if ni != nj {
			return ni < nj
		}
		return strings.HasSuffix(names[i], "/first")
	})
	devices := map[string]float64{}
	for _, name := range names {
		if f := res[name].Figures; f["devices"] > 0 {
			devices[strings.TrimSuffix(name, "/first")] = f["devices"]
		}
	}
	for _, name := range names {
		f := res[name].Figures
		what := "shares, whole GPUs"
		if strings.HasPrefix(name, "DecideScaleMIG/") {
			what = "MIG 1g.10gb"
		}
		base := name[:strings.LastIndex(name, "/")]
		r.printf("| %d | %.0f | %s | %s | %s | %.0f | %.0f MiB | %.0f |\n", nodesOf(name), devices[base], what, name[strings.LastIndex(name, "/")+1:], sec(f["ns/op"]), f["admitted"], f["B/op"]/(1<<20), f["allocs/op"])
	}
	r.printf("\n- What grows with the cluster is the first cycle's work (the device catalog and each node's index); a running controller's cycle allocates about the same whatever the number of nodes: its cost is the pods', not the nodes'. The times of one iteration on a shared machine are noisy; the allocation counts are not.\n")
	next5k, ok := res["DecideScale/nodes=5000/next"]
	if !ok {
		r.unmeasured("Decision cycle, 10,000 pending pods on 5,000 nodes (shares; a running controller's cycle)", "< 1 s", "the short run takes 500 nodes only")
		return nil
	}
	r.target("Decision cycle, 10,000 pending pods on 5,000 nodes (shares; a running controller's cycle)", "< 1 s", sec(next5k.Figures["ns/op"]), next5k.Figures["ns/op"] < 1e9)
	if m := res["DecideScaleMIG/nodes=5000/next"]; m.Figures != nil {
		r.target("Decision cycle, 10,000 pending pods on 5,000 nodes (dynamic MIG; a running controller's cycle)", "< 1 s", sec(m.Figures["ns/op"]), m.Figures["ns/op"] < 1e9)
	}
	a, b := res["DecideScale/nodes=1000/next"].Figures, res["DecideScale/nodes=10000/next"].Figures
	if a != nil && b != nil {
		r.target("Decision cycle cost from 1,000 to 10,000 nodes (shares, next cycle)", "linear or better (<= 10x)", fmt.Sprintf("%.1fx", b["ns/op"]/a["ns/op"]), b["ns/op"]/a["ns/op"] <= 10)
	}
	return nil
}

// nodesOf reads N from a benchmark name ".../nodes=N/...".
func nodesOf(name string) int {
	_, after, _ := strings.Cut(name, "nodes=")
	n, _ := strconv.Atoi(strings.SplitN(after, "/", 2)[0])
	return n
}

// migAdmission compares one admission cycle with MIG prioritized lists to
// the same cycle with shares, in one run.
func migAdmission(r *report, sec func(float64) string) error {
	g := goBenchRun{pkg: "./hack/internal/sim/", pattern: "AdmissionCycleMIG", benchtime: r.iterations("10x", "1x")}
	r.printf("\n### MIG admission vs shares\n\n")
	r.printf("One admission cycle over the 1,000 jobs of the mixed trace behind the three queues of the packing section (12 x DGX H100, 12 x DGX A100, 40 x 4-T4 nodes): with memory shares, and with shares + MIG, where every claim is a prioritized list of MIG sizes with a share last (up to 8 alternatives, 6 on this cluster, each a CEL selector). MIG placements make an 8 x H100 node publish 200 devices. *First cycle*: from a fresh engine, as after a controller start. *Next cycle*: the same engine decides again with the slices and classes unchanged, as every later cycle of a running controller does (what it reserved for the pods is forgotten first, so that it decides the same; the benchmark fails if it admits other pods).\n\n")
	r.printf("Command: `%s`\n\n", g.command())
	res, err := g.run()
	if err != nil {
		return err
	}
	fig := func(name string) map[string]float64 { return res["AdmissionCycleMIG/"+name].Figures }
	sh, mig := fig("tessera-shares"), fig("tessera-shares+mig")
	shNext, migNext := fig("tessera-shares-next-cycle"), fig("tessera-shares+mig-next-cycle")
	ratio, ratioNext := mig["ns/op"]/sh["ns/op"], migNext["ns/op"]/shNext["ns/op"]
	r.printf("| cycle | MIG / shares | time per cycle | admitted | allocator calls | allocations not tried (failure shared) | CEL evaluations |\n|---|---:|---:|---:|---:|---:|---:|\n")
	row := func(name, ratio string, f map[string]float64) {
		r.printf("| %s | %s | %s | %.0f | %.0f | %.0f | %.0f |\n", name, ratio, sec(f["ns/op"]), f["admitted"], f["allocator-calls"], f["shared-failures"], f["cel-evaluations"])
	}
	row("shares, first cycle", "1.00x", sh)
	row("shares + MIG, first cycle", fmt.Sprintf("**%.1fx**", ratio), mig)
	row("shares, next cycle", "1.00x", shNext)
	row("shares + MIG, next cycle", fmt.Sprintf("**%.1fx**", ratioNext), migNext)
	r.printf("\n")
	r.printf("- Placement simulation (`pkg/control/decide/placement.go`) takes shortcuts that change no placement (`shortcuts.go`; tests compare every allocation result and every decision with `ExactPlacement`, which turns them off): the allocator gets only the devices a claim can select plus the allocated ones; a one-request claim goes alternative by alternative over the devices of the first counter sets that may hold one (with the allocated devices of those sets, from which the allocator derives counters), and its result is checked to be the allocator's first choice over all devices; counter sets where an alternative found nothing, and alternatives that failed on a node, are remembered until those allocations change, and shared by claims whose alternatives are the same or ask for more capacity.\n")
	r.printf("- CEL: a selector that reads only named parts of a device (`device.driver`, `device.attributes[\"<domain>\"].<name>`, `device.capacity[...]`, found from its syntax tree, `celrefs.go`) is evaluated once per distinct value of those parts, so the MIG devices of every GPU of a model share one result per selector despite their different UUIDs (the *CEL evaluations* column); selectors that read the same parts (the MIG sizes of one claim's list) number a node's devices in one pass. When every other device the ladder lists is allocated exclusively, the allocator runs with the alternative alone and without selectors, so it evaluates no CEL at all; claims with config are confirmed by an exact call over the device found.\n")
	r.printf("- Across cycles the engine keeps the device catalog, each node's device index (positions, counter sets, which devices each selector and alternative select) and the CEL results while the slices and classes are the same objects (the controller passes the previous cycle's object for every slice and class whose resourceVersion did not change); a republished node or a replaced class counts in the very next cycle (`TestEngineFollowsSlicesAndClasses`). The first cycle after a start also builds those for every device (an 8 x H100 node in MIG mode publishes 200 devices where it publishes 8 for shares), which is why it costs more than the next ones. What is left in a MIG cycle is mostly the allocator itself: more calls than with shares (one per alternative tried) over devices with counter sets.\n")
	r.target("MIG admission cycle vs shares (1,000 jobs, mixed trace; a running controller's cycle)", "< 3x", fmt.Sprintf("%.1fx (%s vs %s); the first cycle after a start %.1fx", ratioNext, sec(migNext["ns/op"]), sec(shNext["ns/op"]), ratio), ratioNext < 3)
	return nil
}

// publication runs the ResourceSlice publication benchmark.
func publication(_ context.Context, r *report) error {
	n := r.iterations("20x", "1x")
	g := goBenchRun{pkg: "./pkg/gpu/nodeslices/", pattern: "Publish", benchtime: n}
	r.printf("\n## ResourceSlice publication: 8 x H100 with dynamic MIG\n\n")
	r.printf("Discovery (mock NVML), the device model and rendering of one `dgxh100` node in dynamic MIG mode: every whole GPU with its memory and compute shares, and every MIG placement of every profile, with the counters that keep them exclusive. Objects and JSON bytes are what the API server receives; the time is the plugin's own work, without the API writes (the kubelet plugin library's ResourceSlice controller sends them, one create or update per slice that changed).\n\nCommand: `%s`\n\n", g.command())
	res, err := g.run()
	if err != nil {
		return err
	}
	f := res["PublishDGXH100DynamicMIG"].Figures
	r.printf("| node | ResourceSlices | devices | JSON bytes | time (discover + model + render) |\n|---|---:|---:|---:|---:|\n")
	r.printf("| 8 x H100 80GB, dynamic MIG | %.0f | %.0f | %.0f (%.0f KiB) | %s |\n", f["slices"], f["devices"], f["json-bytes"], f["json-bytes"]/1024, time.Duration(f["ns/op"]).Round(10*time.Microsecond))
	return nil
}

// usageSampling runs the usage sampling benchmark: one pass over 8 GPUs
// with 100 compute processes.
func usageSampling(_ context.Context, r *report) error {
	n := r.iterations("2000x", "20x")
	g := goBenchRun{pkg: "./pkg/node/procusage/", pattern: "Sample", benchtime: n}
	r.printf("\n## Usage sampling: 8 GPUs, 100 compute processes\n\n")
	r.printf("One pass of the kubelet plugin's usage sampler (docs/observability.md): NVML's compute processes and SM samples of every GPU (mock NVML: 8 x T4, 100 processes) and `/proc/<pid>/cgroup` of each process (files in a temp directory laid out like `/proc`), mapped to pod and container. Attribution to claims, metrics and status writes are not in it: they are map lookups per process.\n\nCommand: `%s`\n\n", g.command())
	res, err := g.run()
	if err != nil {
		return err
	}
	d := time.Duration(res["Sample"].Figures["ns/op"])
	cold := time.Duration(res["SampleCold"].Figures["ns/op"])
	r.printf("| GPUs | processes | pass | time per pass |\n|---:|---:|---|---:|\n")
	r.printf("| 8 | 100 | steady state (the processes of the last pass keep their pod) | %s |\n", d.Round(10*time.Microsecond))
	r.printf("| 8 | 100 | cold (every process looked up in /proc, as after a start) | %s |\n", cold.Round(10*time.Microsecond))
	r.target("usage sampling pass, 8 GPUs x 100 processes", "< 5 ms", d.Round(10*time.Microsecond).String(), d < 5*time.Millisecond)
	return nil
}
