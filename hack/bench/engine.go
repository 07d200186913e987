package main

import (
	"fmt"
	"strings"
	"time"
)

// enginePattern selects the admission benchmarks that this code and the
// baseline both have, by their exact names.
const enginePattern = "^Benchmark(Admission|AdmissionFullCluster|Gang512)$"

// engineBenchmarks are enginePattern's benchmarks, in the report's order.
func engineBenchmarks() []string { return []string{"Admission", "AdmissionFullCluster", "Gang512"} }

// engineRuns are the rounds of the admission benchmarks, this code's and
// the baseline's; baseErr is why the baseline has none.
type engineRuns struct {
	cur, base []map[string]benchResult
	baseErr   error
}

// runEngineRounds runs this code's benchmarks rounds times, each right
// after the baseline's (baseline, this code, baseline, this code) so that
// both see the same noise of a shared machine. A baseline that fails (one
// that does not build, above all) is reported, not fatal: it stops being
// run and keeps no round. this code failing is the section's failure.
func runEngineRounds(cur goBenchRun, base *goBenchRun, rounds int, run func(goBenchRun) (map[string]benchResult, error)) (engineRuns, error) {
	var out engineRuns
	for range rounds {
		if base != nil && out.baseErr == nil {
			res, err := run(*base)
			if err != nil {
				out.base, out.baseErr = nil, err
			} else {
				out.base = append(out.base, res)
			}
		}
		res, err := run(cur)
		if err != nil {
			return out, err
		}
		out.cur = append(out.cur, res)
	}
	return out, nil
}

// meanRounds is each benchmark's figures averaged over the rounds that
// have it, with the iterations of all of them.
func meanRounds(rounds []map[string]benchResult) map[string]benchResult {
	sum, count := map[string]benchResult{}, map[string]map[string]int{}
	for _, res := range rounds {
		for name, r := range res {
			s, ok := sum[name]
			if !ok {
				s, count[name] = benchResult{Figures: map[string]float64{}}, map[string]int{}
			}
			s.N += r.N
			for unit, v := range r.Figures {
				s.Figures[unit] += v
				count[name][unit]++
			}
			sum[name] = s
		}
	}
	for name, s := range sum {
		for unit := range s.Figures {
			s.Figures[unit] /= float64(count[name][unit])
		}
	}
	return sum
}

// cycleTime is a benchmark's ns/op as a duration to the millisecond.
func cycleTime(ns float64) string { return time.Duration(ns).Round(time.Millisecond).String() }

// speed is how fast this code is against the baseline, baseline time ÷
// this code's (0.90x: this code takes 1/0.9 of the baseline's time), or
// "-" where either is missing.
func speed(base, cur benchResult) string {
	if base.Figures["ns/op"] <= 0 {
		return "-"
	}
	return ratioOf(base.Figures["ns/op"], cur.Figures["ns/op"])
}

// engineComparison is the table of this code against the baseline
// (label), benchmark by benchmark: the mean of the rounds, the ratio, and
// each round's ratio to show the noise.
func engineComparison(label string, runs engineRuns) string {
	base, cur := meanRounds(runs.base), meanRounds(runs.cur)
	cell := func(r benchResult) string {
		if r.Figures["ns/op"] <= 0 {
			return "-"
		}
		if w := r.Figures["workloads/s"]; w > 0 {
			return fmt.Sprintf("%s (%.0f workloads/s)", cycleTime(r.Figures["ns/op"]), w)
		}
		return cycleTime(r.Figures["ns/op"])
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| benchmark | %s: time per cycle | this code: time per cycle | this code's speed against it | each round |\n|---|---:|---:|---:|---|\n", label)
	for _, name := range engineBenchmarks() {
		var each []string
		for i := range min(len(runs.base), len(runs.cur)) {
			each = append(each, speed(runs.base[i][name], runs.cur[i][name]))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | **%s** | %s |\n", name, cell(base[name]), cell(cur[name]), speed(base[name], cur[name]), strings.Join(each, ", "))
	}
	return b.String()
}

// engineTarget is the targets table's row (what) for this code against
// the baseline: reported, without a target.
func engineTarget(what string, runs engineRuns) target {
	base, cur := meanRounds(runs.base), meanRounds(runs.cur)
	var parts []string
	for _, name := range engineBenchmarks() {
		p := fmt.Sprintf("%s %s", name, speed(base[name], cur[name]))
		// The two figures the targets table quotes elsewhere, beside their
		// baseline's.
		switch name {
		case "Admission":
			p += fmt.Sprintf(" (%.0f vs %.0f workloads/s)", cur[name].Figures["workloads/s"], base[name].Figures["workloads/s"])
		case "Gang512":
			p += fmt.Sprintf(" (%s vs %s)", cycleTime(cur[name].Figures["ns/op"]), cycleTime(base[name].Figures["ns/op"]))
		}
		parts = append(parts, p)
	}
	return target{
		what:     what,
		goal:     "reported (no target)",
		measured: strings.Join(parts, "; "),
		verdict:  "reported",
	}
}

// firstLine is a message's first line, for a table cell.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// shortRev is a full commit hash shortened as git shows it; other
// revisions (HEAD~3, a tag) as given.
func shortRev(rev string) string {
	if len(rev) == 40 && strings.Trim(rev, "0123456789abcdef") == "" {
		return rev[:7]
	}
	return rev
}
