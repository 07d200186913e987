package schedperf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sampleResults is the shape scheduler_perf writes (abridged; SchedulingBasic
// in the form of releases without the benchmark in the name): one
// SchedulingThroughput item per measured case, among other metrics.
const sampleResults = `{
  "version": "v1",
  "dataItems": [
    {"data": {"Average": 61.5, "Perc50": 60, "Perc90": 80, "Perc95": 85, "Perc99": 90}, "unit": "pods/s",
     "labels": {"Metric": "SchedulingThroughput", "Name": "BenchmarkPerfScheduling/UpstreamTestDriverWithResourceClaimTemplate/5000pods_500nodes/test", "event": "not applicable"}},
    {"data": {"Perc50": 12.5, "Perc99": 40}, "unit": "ms",
     "labels": {"Metric": "scheduler_pod_scheduling_sli_duration_seconds", "Name": "UpstreamTestDriverWithResourceClaimTemplate/5000pods_500nodes/namespace-2"}},
    {"data": {"Average": 55, "Perc50": 54, "Perc90": 70, "Perc99": 75}, "unit": "pods/s",
     "labels": {"Metric": "SchedulingThroughput", "Name": "BenchmarkPerfScheduling/TesseraSharesWithResourceClaimTemplate/5000pods_500nodes/test"}},
    {"data": {"Average": 200, "Perc50": 190, "Perc90": 250, "Perc99": 260}, "unit": "pods/s",
     "labels": {"Metric": "SchedulingThroughput", "Name": "SchedulingBasic/5000pods_500nodes/namespace-2"}}
  ]
}`

func TestParseResults(t *testing.T) {
	dup := strings.Replace(sampleResults, "SchedulingBasic/", "TesseraSharesWithResourceClaimTemplate/", 1)
	tests := []struct {
		name    string
		json    string
		want    map[string]Throughput
		wantErr string
	}{
		{
			name: "three cases, other metrics ignored",
			json: sampleResults,
			want: map[string]Throughput{
				CaseUpstream: {Average: 61.5, Perc50: 60, Perc90: 80, Perc99: 90},
				CaseTessera:  {Average: 55, Perc50: 54, Perc90: 70, Perc99: 75},
				CasePlain:    {Average: 200, Perc50: 190, Perc90: 250, Perc99: 260},
			},
		},
		{name: "no throughput (too few pods to sample)", json: `{"version":"v1","dataItems":[{"labels":{"Name":"SchedulingBasic/x/y"}}]}`, want: map[string]Throughput{}},
		{name: "a case twice", json: dup, wantErr: "two SchedulingThroughput items"},
		{name: "no average", json: `{"dataItems":[{"data":{"Perc50":1},"labels":{"Metric":"SchedulingThroughput","Name":"A/b/c"}}]}`, wantErr: "has no Average"},
		{name: "no name", json: `{"dataItems":[{"data":{"Average":1},"labels":{"Metric":"SchedulingThroughput"}}]}`, wantErr: "no Name label"},
		{name: "not JSON", json: "PASS", wantErr: "reading scheduler_perf results"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseResults([]byte(tc.json))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseResults() error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("ParseResults() = %v, want %v", got, tc.want)
			}
			for k, w := range tc.want {
				if got[k] != w {
					t.Errorf("%s: %+v, want %+v", k, got[k], w)
				}
			}
		})
	}
}

func TestResultsFileIsTheNewest(t *testing.T) {
	dir := t.TempDir()
	if _, err := ResultsFile(dir); err == nil {
		t.Fatal("ResultsFile of an empty directory: no error")
	}
	old := filepath.Join(dir, "BenchmarkPerfScheduling_benchmark_tessera_2026-01-01T00:00:00Z.json")
	newer := filepath.Join(dir, "BenchmarkPerfScheduling_benchmark_tessera_2026-01-02T00:00:00Z.json")
	for i, p := range []string{newer, old} {
		if err := os.WriteFile(p, []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
		ts := time.Now().Add(time.Duration(-i) * time.Hour)
		if err := os.Chtimes(p, ts, ts); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := ResultsFile(dir); err != nil || got != newer {
		t.Errorf("ResultsFile() = %q, %v; want %q", got, err, newer)
	}
}

func TestSectionVerdict(t *testing.T) {
	base := Run{Config: Config{Profile: "dgxh100", Share: "8Gi", Nodes: 500, InitPods: 2500, MeasurePods: 2500}, Command: "make bench-upstream"}
	tests := []struct {
		name    string
		up, te  float64
		want    string
		without string
	}{
		{"within the target", 60, 57, "| 1.05x (60.0 vs 57.0 pods/s) | met |", "missed"},
		{"over the target", 60, 40, "| 1.50x (60.0 vs 40.0 pods/s) | **missed** |", "| met |"},
		{"Tessera's case not measured", 60, 0, "| not measured | **missed** |", "| met |"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := base
			r.Results = map[string]Throughput{CaseUpstream: {Average: tc.up}, CasePlain: {Average: 200}}
			if tc.te > 0 {
				r.Results[CaseTessera] = Throughput{Average: tc.te}
			}
			s := Section(r)
			if !strings.Contains(s, tc.want) || strings.Contains(s, tc.without) {
				t.Errorf("Section() has no %q or has %q:\n%s", tc.want, tc.without, s)
			}
			if !strings.HasPrefix(s, "<!-- bench-upstream:start -->") || !strings.HasSuffix(s, "<!-- bench-upstream:end -->\n") {
				t.Errorf("Section() is not between the bench-upstream markers:\n%s", s)
			}
		})
	}
}
