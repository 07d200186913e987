package main

import (
	"context"
	"fmt"
	"strings"
)

// prepareRatioMax is the most a share's prepare p99 may cost in units of
// one atomic write's p99 on the same disk in the same run. A share's
// prepare makes exactly one fsynced write, the atomic write measured
// alone (1x); that fsync's journal commit also carries what the prepare
// wrote unsynced just before it (its CDI spec, created and renamed, and
// its accounting directory), which can cost about as much again; and the
// plugin's own work (gRPC, reading the claim, rendering the spec: the
// tmpfs column, 1.01 ms at p99 in the run of 2026-11-25) up to one more.
// Beyond that, the plugin costs more than the disk it waits for, whatever
// the disk.
const prepareRatioMax = 3.0

// prepareKinds are the claim kinds of BenchmarkPrepareLatency and their
// labels in the report.
func prepareKinds() []struct{ key, label string } {
	return []struct{ key, label string }{
		{"share", "share (1 GiB of a T4, interposer mode, `cores` 25)"},
		{"whole", "whole GPU"},
		{"timeslice", "time slice, `timeSliceInterval: Short`"},
		{"mig", "MIG `1g.5gb` (mock creation)"},
	}
}

// prepareBench is the plugin's prepare benchmark with the atomic write its
// target is a ratio to, in one go test, so that both see the same disk at
// the same time (the write runs first, right before the share's prepare).
func prepareBench(n string, env ...string) goBenchRun {
	return goBenchRun{pkg: "./pkg/node/plugin/", pattern: "AtomicWrite|PrepareLatency", benchtime: n, env: env}
}

// prepareLatency runs the plugin's prepare benchmark twice, with the node's
// directories on the disk and on tmpfs, so that the cost of fsync shows,
// each next to one atomic write on the same file system.
func prepareLatency(_ context.Context, r *report) error {
	n := r.iterations("2000x", "20x")
	disk, tmpfs := prepareBench(n), prepareBench(n, "TESSERA_BENCH_DIR=/dev/shm")
	r.printf("\n## Prepare and unprepare latency\n\n")
	r.printf("`NodePrepareResources` and `NodeUnprepareResources` as the kubelet calls them: a gRPC client on the plugin's Unix socket, the real plugin (`plugin.Start`: kubelet plugin helper, preparer, checkpoint, CDI writer, health, status writer) over mock GPUs (`t4:3,a100-40gb`, MIG on the A100, 4 time slices on GPU 2) and a fake API server that holds the claims. Each iteration prepares one new claim and unprepares it; p50 and p99 are over all iterations (%s per kind), per call. ", n)
	r.printf("In the same `go test`, right before the share's prepare, *one atomic write* (`BenchmarkAtomicWrite`) writes a 3 KiB checkpoint record as often (%s) into a checkpoint directory on the same file system, as the plugin's checkpoint does (`pkg/atomicfile`: temp file, write, fsync, rename, fsync of the directory): what the disk alone costs.\n\n", n)
	r.printf("Commands:\n\n```sh\n%s\n%s   # every directory on tmpfs: the disk's fsync taken out\n```\n\n", disk.command(), tmpfs.command())
	onDisk, err := disk.run()
	if err != nil {
		return err
	}
	onTmpfs, err := tmpfs.run()
	if err != nil {
		return err
	}
	r.printf("%s\n", prepareTable(onDisk, onTmpfs))
	r.printf("- A share costs one fsynced write (its PrepareCompleted checkpoint: temp file, fsync, rename, directory fsync); its CDI spec is renamed into place without fsync (see [enforcement.md](enforcement.md)). The disk's fsync is most of the difference between the disk and tmpfs columns, and most of the variance: while other jobs hammer the disk, the p99 rises several-fold while the p50 barely moves.\n")
	r.printf("- A time slice or MIG claim costs two fsynced writes (PrepareStarted, PrepareCompleted) plus setting the interval (the mock records it in a file) or creating the instance.\n")
	r.printf("- MIG: the mock creates instances instantly but persists its MIG state with an fsynced write per GPU and compute instance, which is the extra disk time in that row. Creating a MIG instance on real hardware takes on the order of a second and is not measured here; everything else on the MIG path is.\n")
	r.printf("- The status write (`status.devices`) runs in the background and is not in these figures.\n")
	r.printf("- **The target is a ratio**: a share's prepare p99 at most %.0fx one atomic write's p99 on the same disk in the same run. It was an absolute p99 < 5 ms; it changed because an fsync's time moves with the disk and with whatever else writes to it (the same code gave a 2.98 ms p99 in one run here and 6.7 ms on another machine of this kind), so the absolute figure judged the disk, not the plugin. Why %.0fx: the share's one fsynced write is 1x; the same journal commit also carries what the prepare wrote unsynced just before it (its CDI spec and accounting directory); and the plugin's own work (gRPC, reading the claim, rendering the spec) is the tmpfs column, which had a 1.01 ms p99 in the run that quoted 2.98 ms. The absolute p99 stays in the targets table, reported without a target.\n", prepareRatioMax, prepareRatioMax)
	r.targets = append(r.targets, prepareTargets(onDisk, onTmpfs)...)
	return nil
}

// prepareTable is the section's table: one row per claim kind, then the
// atomic write alone, and the share's ratio to it on each file system.
func prepareTable(onDisk, onTmpfs map[string]benchResult) string {
	var b strings.Builder
	b.WriteString("| claim kind | prepare p50 | prepare p99 | unprepare p50 | unprepare p99 | tmpfs: prepare p50 / p99 | disk / tmpfs, prepare p50 |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, k := range prepareKinds() {
		d, t := onDisk["PrepareLatency/"+k.key].Figures, onTmpfs["PrepareLatency/"+k.key].Figures
		fmt.Fprintf(&b, "| %s | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %.2f / %.2f ms | %s |\n", k.label,
			d["prepare-p50-ms"], d["prepare-p99-ms"], d["unprepare-p50-ms"], d["unprepare-p99-ms"], t["prepare-p50-ms"], t["prepare-p99-ms"], ratioOf(d["prepare-p50-ms"], t["prepare-p50-ms"]))
	}
	d, t := onDisk["AtomicWrite"].Figures, onTmpfs["AtomicWrite"].Figures
	fmt.Fprintf(&b, "| *one atomic write* (3 KiB checkpoint record: temp file, fsync, rename, directory fsync) | %.2f ms | %.2f ms | - | - | %.2f / %.2f ms | %s |\n",
		d["write-p50-ms"], d["write-p99-ms"], t["write-p50-ms"], t["write-p99-ms"], ratioOf(d["write-p50-ms"], t["write-p50-ms"]))
	share := func(res map[string]benchResult) string {
		return ratioOf(res["PrepareLatency/share"].Figures["prepare-p99-ms"], res["AtomicWrite"].Figures["write-p99-ms"])
	}
	fmt.Fprintf(&b, "\nShare prepare p99 ÷ one atomic write p99: **%s on the disk** (target <= %.0fx); %s on tmpfs (no target: without fsync the write is a memory copy, and the ratio is the plugin's own work over it).\n",
		share(onDisk), prepareRatioMax, share(onTmpfs))
	return b.String()
}

// prepareTargets are the prepare rows of the targets table: the share's
// p99 as a ratio to the same disk's atomic write, and its absolute p99,
// the old target's figure, reported beside it.
func prepareTargets(onDisk, onTmpfs map[string]benchResult) []target {
	p99 := onDisk["PrepareLatency/share"].Figures["prepare-p99-ms"]
	write := onDisk["AtomicWrite"].Figures["write-p99-ms"]
	ratio := target{what: "Prepare p99, share claim ÷ one atomic write p99 (same disk, same run)", goal: fmt.Sprintf("<= %.0fx", prepareRatioMax)}
	if p99 > 0 && write > 0 {
		ratio.measured = fmt.Sprintf("%.2fx (%.2f ms ÷ %.2f ms)", p99/write, p99, write)
		ratio.verdict = verdictOf(p99/write <= prepareRatioMax)
	} else {
		ratio.measured, ratio.verdict = "no prepare or atomic write figure in this run", "not measured"
	}
	absolute := target{
		what:     "Prepare p99, share claim (disk), absolute",
		goal:     "reported (was < 5 ms: fsync time moves with the disk, see the ratio above)",
		measured: fmt.Sprintf("%.2f ms (tmpfs %.2f ms)", p99, onTmpfs["PrepareLatency/share"].Figures["prepare-p99-ms"]),
		verdict:  "reported",
	}
	return []target{ratio, absolute}
}

// ratioOf is a / b as "1.23x", or "-" without b.
func ratioOf(a, b float64) string {
	if b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}
