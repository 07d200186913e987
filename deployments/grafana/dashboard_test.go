// Package grafana holds Tessera's Grafana dashboard (tessera.json); this
// test keeps its queries in line with the metrics the binaries export.
package grafana

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/pkg/control/controller"
	"github.com/tessera-dev/tessera/pkg/node/plugin"
)

var metricRE = regexp.MustCompile(`\btessera_[a-z0-9_]+`)

// queries returns every PromQL string of the dashboard: panel targets and
// template variable queries.
func queries(t *testing.T, v any) []string {
	t.Helper()
	var out []string
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && (k == "expr" || (k == "query" && strings.Contains(s, "("))) {
				out = append(out, s)
				continue
			}
			out = append(out, queries(t, e)...)
		}
	case []any:
		for _, e := range x {
			out = append(out, queries(t, e)...)
		}
	}
	return out
}

func TestDashboardQueriesNameExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile("tessera.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("tessera.json is not JSON: %v", err)
	}
	exported := map[string]bool{}
	for _, n := range append(controller.MetricNames(), plugin.MetricNames()...) {
		exported[n] = true
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if strings.HasSuffix(n, "_seconds") {
				exported[n+suffix] = true
			}
		}
	}
	qs := queries(t, dash)
	if len(qs) < 10 {
		t.Fatalf("found %d queries; the dashboard has more (is the walk broken?)", len(qs))
	}
	for _, q := range qs {
		names := metricRE.FindAllString(q, -1)
		if len(names) == 0 {
			t.Errorf("query names no Tessera metric: %s", q)
		}
		for _, n := range names {
			if !exported[n] {
				t.Errorf("query names %s, which no Tessera binary exports: %s", n, q)
			}
		}
		if strings.Count(q, "(") != strings.Count(q, ")") || strings.Count(q, "{") != strings.Count(q, "}") {
			t.Errorf("unbalanced query: %s", q)
		}
	}
}
