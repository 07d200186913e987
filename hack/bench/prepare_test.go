package main

import (
	"strings"
	"testing"
)

// prepareRun is one file system's results: the share's prepare p99 and
// p50 and the atomic write's p99 and p50 (0: the benchmark is missing).
func prepareRun(prepP50, prepP99, writeP50, writeP99 float64) map[string]benchResult {
	res := map[string]benchResult{}
	if prepP99 > 0 {
		res["PrepareLatency/share"] = benchResult{N: 20, Figures: map[string]float64{"prepare-p50-ms": prepP50, "prepare-p99-ms": prepP99, "unprepare-p50-ms": 0.4, "unprepare-p99-ms": 0.8}}
	}
	if writeP99 > 0 {
		res["AtomicWrite"] = benchResult{N: 20, Figures: map[string]float64{"write-p50-ms": writeP50, "write-p99-ms": writeP99}}
	}
	return res
}

func TestPrepareTargets(t *testing.T) {
	tmpfs := prepareRun(0.42, 1.01, 0.04, 0.24)
	tests := []struct {
		name                    string
		disk                    map[string]benchResult
		ratio, verdict, absolut string
	}{
		// Another machine of this kind: 6.7 ms, on a slower disk.
		{"met", prepareRun(2.5, 6.7, 1.1, 5.0), "1.34x (6.70 ms ÷ 5.00 ms)", "met", "6.70 ms (tmpfs 1.01 ms)"},
		{"on its edge", prepareRun(2.5, 6.0, 1.1, 2.0), "3.00x (6.00 ms ÷ 2.00 ms)", "met", "6.00 ms (tmpfs 1.01 ms)"},
		// A fast disk does not hide a slow plugin.
		{"missed", prepareRun(2.5, 4.0, 0.2, 1.0), "4.00x (4.00 ms ÷ 1.00 ms)", "**missed**", "4.00 ms (tmpfs 1.01 ms)"},
		{"no atomic write", prepareRun(2.5, 4.0, 0, 0), "no prepare or atomic write figure in this run", "not measured", "4.00 ms (tmpfs 1.01 ms)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := prepareTargets(tc.disk, tmpfs)
			if len(got) != 2 {
				t.Fatalf("%d rows, want the ratio and the absolute p99", len(got))
			}
			ratio, abs := got[0], got[1]
			if ratio.goal != "<= 3x" || ratio.measured != tc.ratio || ratio.verdict != tc.verdict {
				t.Errorf("ratio row %+v, want %q, %q", ratio, tc.ratio, tc.verdict)
			}
			// The old absolute target is kept as a figure, never judged.
			if abs.verdict != "reported" || abs.measured != tc.absolut || !strings.Contains(abs.goal, "was < 5 ms") {
				t.Errorf("absolute row %+v, want %q reported", abs, tc.absolut)
			}
		})
	}
}

func TestPrepareTable(t *testing.T) {
	table := prepareTable(prepareRun(1.36, 2.98, 0.9, 2.1), prepareRun(0.42, 1.01, 0.04, 0.25))
	for _, want := range []string{
		"| share (1 GiB of a T4, interposer mode, `cores` 25) | 1.36 ms | 2.98 ms | 0.40 ms | 0.80 ms | 0.42 / 1.01 ms | 3.24x |",
		// Kinds this run lacks are zeros with no ratio, not a crash.
		"| whole GPU | 0.00 ms | 0.00 ms | 0.00 ms | 0.00 ms | 0.00 / 0.00 ms | - |",
		"| *one atomic write* (3 KiB checkpoint record: temp file, fsync, rename, directory fsync) | 0.90 ms | 2.10 ms | - | - | 0.04 / 0.25 ms | 22.50x |",
		"Share prepare p99 ÷ one atomic write p99: **1.42x on the disk** (target <= 3x); 4.04x on tmpfs",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

func TestRatioOf(t *testing.T) {
	for _, tc := range []struct {
		a, b float64
		want string
	}{{3, 2, "1.50x"}, {1, 0, "-"}, {0, 2, "0.00x"}} {
		if got := ratioOf(tc.a, tc.b); got != tc.want {
			t.Errorf("ratioOf(%v, %v) = %q, want %q", tc.a, tc.b, got, tc.want)
		}
	}
}
