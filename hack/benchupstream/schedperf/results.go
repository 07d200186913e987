package schedperf

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// dataItems is scheduler_perf's results file (BenchmarkPerfScheduling_*.json,
// the format perf-dash reads).
type dataItems struct {
	Version   string `json:"version"`
	DataItems []struct {
		Data   map[string]float64 `json:"data"`
		Unit   string             `json:"unit"`
		Labels map[string]string  `json:"labels"`
	} `json:"dataItems"`
}

// Throughput is the SchedulingThroughput of one test case: pods scheduled
// per second, sampled every second while its measured pods were scheduled.
type Throughput struct {
	Average, Perc50, Perc90, Perc99 float64
}

// ParseResults reads a results file and returns the SchedulingThroughput of
// each test case, by test case name (from the Name label,
// "BenchmarkPerfScheduling/<case>/<workload>/<namespace>").
func ParseResults(data []byte) (map[string]Throughput, error) {
	var items dataItems
	if err := json.Unmarshal(data, &items); err != nil {
		return nil, fmt.Errorf("reading scheduler_perf results: %w", err)
	}
	out := map[string]Throughput{}
	for _, it := range items.DataItems {
		if it.Labels["Metric"] != "SchedulingThroughput" {
			continue
		}
		name := caseName(it.Labels["Name"])
		if name == "" {
			return nil, fmt.Errorf("a SchedulingThroughput item has no Name label")
		}
		avg, ok := it.Data["Average"]
		if !ok {
			return nil, fmt.Errorf("%s: SchedulingThroughput has no Average", name)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("%s: two SchedulingThroughput items; run each case once", name)
		}
		out[name] = Throughput{Average: avg, Perc50: it.Data["Perc50"], Perc90: it.Data["Perc90"], Perc99: it.Data["Perc99"]}
	}
	return out, nil
}

// caseName is the test case of a Name label: scheduler_perf writes
// "<benchmark>/<case>/<workload>/<namespace>" (older releases leave the
// benchmark out).
func caseName(label string) string {
	parts := strings.Split(label, "/")
	if len(parts) > 1 && strings.HasPrefix(parts[0], "Benchmark") {
		parts = parts[1:]
	}
	return parts[0]
}

// ResultsFile is the newest BenchmarkPerfScheduling_*.json in dir.
func ResultsFile(dir string) (string, error) {
	matches, err := filepath.Glob(filepath.Join(dir, "BenchmarkPerfScheduling_*.json"))
	if err != nil {
		return "", err
	}
	if len(matches) == 0 {
		return "", fmt.Errorf("scheduler_perf wrote no BenchmarkPerfScheduling_*.json into %s", dir)
	}
	sort.Slice(matches, func(i, j int) bool {
		a, _ := os.Stat(matches[i])
		b, _ := os.Stat(matches[j])
		return a != nil && b != nil && a.ModTime().Before(b.ModTime())
	})
	return matches[len(matches)-1], nil
}
