package main

import (
	"errors"
	"strings"
	"testing"
)

// res builds one run's results: name -> ns/op and optional workloads/s.
func res(figs map[string][2]float64) map[string]benchResult {
	out := map[string]benchResult{}
	for name, f := range figs {
		r := benchResult{N: 2, Figures: map[string]float64{"ns/op": f[0]}}
		if f[1] > 0 {
			r.Figures["workloads/s"] = f[1]
		}
		out[name] = r
	}
	return out
}

func TestRunEngineRounds(t *testing.T) {
	cur := goBenchRun{pkg: "./pkg/control/decide/"}
	base := goBenchRun{pkg: "./pkg/admission/", dir: "/tmp/base"}
	tests := []struct {
		name      string
		base      *goBenchRun
		failBase  int // the baseline's call that fails (1-based); 0: none
		wantOrder string
		wantBase  int
		wantErr   bool
	}{
		{name: "interleaved", base: &base, wantOrder: "base cur base cur", wantBase: 2},
		{name: "no baseline", wantOrder: "cur cur"},
		// A baseline that fails is not run again, keeps no round, and this
		// code's rounds go on.
		{name: "baseline fails second", base: &base, failBase: 2, wantOrder: "base cur base cur", wantErr: true},
		{name: "baseline fails first", base: &base, failBase: 1, wantOrder: "base cur cur", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var order []string
			baseCalls := 0
			run := func(g goBenchRun) (map[string]benchResult, error) {
				if g.dir == "" {
					order = append(order, "cur")
					return res(map[string][2]float64{"Admission": {2e9, 4500}}), nil
				}
				order = append(order, "base")
				if baseCalls++; baseCalls == tc.failBase {
					return nil, errors.New("go test: exit status 1\ncannot build")
				}
				return res(map[string][2]float64{"Admission": {1.8e9, 5000}}), nil
			}
			got, err := runEngineRounds(cur, tc.base, 2, run)
			if err != nil {
				t.Fatal(err)
			}
			if o := strings.Join(order, " "); o != tc.wantOrder {
				t.Errorf("order %q, want %q", o, tc.wantOrder)
			}
			if len(got.cur) != 2 || len(got.base) != tc.wantBase || (got.baseErr != nil) != tc.wantErr {
				t.Errorf("got %d rounds of this code, %d of the baseline, baseErr %v", len(got.cur), len(got.base), got.baseErr)
			}
		})
	}
	// This code failing is the section's failure.
	_, err := runEngineRounds(cur, &base, 2, func(g goBenchRun) (map[string]benchResult, error) {
		if g.dir == "" {
			return nil, errors.New("broken")
		}
		return nil, nil
	})
	if err == nil {
		t.Error("this code's failure was not returned")
	}
}

func TestMeanRounds(t *testing.T) {
	got := meanRounds([]map[string]benchResult{
		res(map[string][2]float64{"Admission": {2e9, 4000}, "Gang512": {100e6, 0}}),
		res(map[string][2]float64{"Admission": {1e9, 6000}}),
	})
	tests := []struct {
		name, unit string
		want       float64
	}{
		{"Admission", "ns/op", 1.5e9},
		{"Admission", "workloads/s", 5000},
		// Averaged over the rounds that have it.
		{"Gang512", "ns/op", 100e6},
	}
	for _, tc := range tests {
		if v := got[tc.name].Figures[tc.unit]; v != tc.want {
			t.Errorf("%s %s = %v, want %v", tc.name, tc.unit, v, tc.want)
		}
	}
	if got["Admission"].N != 4 {
		t.Errorf("N = %d, want the iterations of both rounds", got["Admission"].N)
	}
	if len(meanRounds(nil)) != 0 {
		t.Error("no rounds gave results")
	}
}

func TestEngineComparison(t *testing.T) {
	// Figures measured on another machine of this kind: 5,550 against
	// 4,995 workloads/s, the gang 138 against 172 ms.
	runs := engineRuns{
		base: []map[string]benchResult{
			res(map[string][2]float64{"Admission": {1.6e9, 5600}, "AdmissionFullCluster": {4e9, 2300}, "Gang512": {136e6, 0}}),
			res(map[string][2]float64{"Admission": {1.688e9, 5500}, "AdmissionFullCluster": {4e9, 2300}, "Gang512": {140e6, 0}}),
		},
		cur: []map[string]benchResult{
			res(map[string][2]float64{"Admission": {1.8e9, 5000}, "AdmissionFullCluster": {4e9, 2300}, "Gang512": {170e6, 0}}),
			res(map[string][2]float64{"Admission": {1.854e9, 4990}, "AdmissionFullCluster": {5e9, 1840}, "Gang512": {174e6, 0}}),
		},
	}
	table := engineComparison("the code of 2026-11-25 (3ccdef2)", runs)
	for _, want := range []string{
		"| benchmark | the code of 2026-11-25 (3ccdef2): time per cycle | this code: time per cycle | this code's speed against it | each round |",
		"| Admission | 1.644s (5550 workloads/s) | 1.827s (4995 workloads/s) | **0.90x** | 0.89x, 0.91x |",
		"| AdmissionFullCluster | 4s (2300 workloads/s) | 4.5s (2070 workloads/s) | **0.89x** | 1.00x, 0.80x |",
		"| Gang512 | 138ms | 172ms | **0.80x** | 0.80x, 0.80x |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	row := engineTarget("Admission engine, this code vs 3ccdef2 (same run)", runs)
	want := target{
		what:     "Admission engine, this code vs 3ccdef2 (same run)",
		goal:     "reported (no target)",
		measured: "Admission 0.90x (4995 vs 5550 workloads/s); AdmissionFullCluster 0.89x; Gang512 0.80x (172ms vs 138ms)",
		verdict:  "reported",
	}
	if row != want {
		t.Errorf("target row\n%+v, want\n%+v", row, want)
	}
	// A benchmark the baseline lacks shows as missing, not as 0.
	runs.base = []map[string]benchResult{res(map[string][2]float64{"Admission": {1.6e9, 5600}})}
	if table := engineComparison("base", runs); !strings.Contains(table, "| Gang512 | - | 172ms | **-** | - |") {
		t.Errorf("a benchmark missing at the baseline:\n%s", table)
	}
}

func TestShortRev(t *testing.T) {
	for rev, want := range map[string]string{
		defaultBaselineRev: "3ccdef2",
		"HEAD~3":           "HEAD~3",
		"3ccdef2":          "3ccdef2",
		"":                 "",
	} {
		if got := shortRev(rev); got != want {
			t.Errorf("shortRev(%q) = %q, want %q", rev, got, want)
		}
	}
}
