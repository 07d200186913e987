package scale

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func parse(t *testing.T, text string) families {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	f, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

const before = `# TYPE apiserver_request_total counter
apiserver_request_total{verb="POST",resource="pods",subresource="",code="201"} 10
apiserver_request_total{verb="GET",resource="pods",subresource="",code="200"} 5
# TYPE rest_client_requests_total counter
rest_client_requests_total{method="PATCH",code="200",host="x"} 7
rest_client_requests_total{method="GET",code="200",host="x"} 100
# TYPE lat histogram
lat_bucket{ep="Filter",le="0.001"} 1
lat_bucket{ep="Filter",le="0.01"} 2
lat_bucket{ep="Filter",le="+Inf"} 2
lat_sum{ep="Filter"} 0.005
lat_count{ep="Filter"} 2
`

const after = `# TYPE apiserver_request_total counter
apiserver_request_total{verb="POST",resource="pods",subresource="",code="201"} 110
apiserver_request_total{verb="POST",resource="pods",subresource="binding",code="201"} 100
apiserver_request_total{verb="PATCH",resource="pods",subresource="status",code="200"} 40
apiserver_request_total{verb="PATCH",resource="pods",subresource="status",code="409"} 10
apiserver_request_total{verb="GET",resource="pods",subresource="",code="200"} 55
# TYPE rest_client_requests_total counter
rest_client_requests_total{method="PATCH",code="200",host="x"} 57
rest_client_requests_total{method="POST",code="201",host="x"} 3
rest_client_requests_total{method="GET",code="200",host="x"} 900
# TYPE lat histogram
lat_bucket{ep="Filter",le="0.001"} 1
lat_bucket{ep="Filter",le="0.01"} 52
lat_bucket{ep="Filter",le="+Inf"} 102
lat_sum{ep="Filter"} 1.005
lat_count{ep="Filter"} 102
lat_bucket{ep="Reserve",le="0.001"} 7
lat_bucket{ep="Reserve",le="0.01"} 7
lat_bucket{ep="Reserve",le="+Inf"} 7
lat_sum{ep="Reserve"} 0.001
lat_count{ep="Reserve"} 7
`

func TestAPIRequestsAreDeltasByVerbAndResource(t *testing.T) {
	b, a := parse(t, before), parse(t, after)
	writes, total := apiRequests(b, a, true)
	if total != 250 {
		t.Errorf("writes = %v, want 250 (100 pod creates, 100 bindings, 50 status patches of any code)", total)
	}
	want := []string{"POST pods 100", "POST pods/binding 100", "PATCH pods/status 50"}
	var got []string
	for _, g := range writes {
		got = append(got, fmt.Sprintf("%s %.0f", g, g.Count))
	}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("writes by verb and resource = %v, want %v (largest first, ties by name)", got, want)
	}
	if _, all := apiRequests(b, a, false); all != 300 {
		t.Errorf("all requests = %v, want 300 (the writes and 50 GETs)", all)
	}
	if w := clientWrites(b, a); w != 53 {
		t.Errorf("client writes = %v, want 53 (50 PATCH + 3 POST; GETs are not writes)", w)
	}
}

func TestHistogramDeltaAndQuantile(t *testing.T) {
	b, a := parse(t, before), parse(t, after)
	filter := func(l map[string]string) bool { return l["ep"] == "Filter" }
	h := sumHistogram(a, "lat", filter).minus(sumHistogram(b, "lat", filter))
	if h.Count != 100 || math.Abs(h.sum-1.0) > 1e-9 {
		t.Fatalf("delta count %v sum %v, want 100 and 1.0", h.Count, h.sum)
	}
	// 50 observations in (0.001, 0.01], 50 above: the median is the top of
	// the second bucket, p25 halfway into it, p99 beyond the highest finite
	// bound (which is 0.01).
	for _, tc := range []struct{ q, want float64 }{{0.25, 0.0055}, {0.5, 0.01}, {0.99, math.Inf(1)}} {
		if got := h.Quantile(tc.q); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := h.TopBound(); got != 0.01 {
		t.Errorf("top bound = %v, want 0.01", got)
	}
	if got := h.Mean(); math.Abs(got-0.01) > 1e-9 {
		t.Errorf("mean = %v, want 0.01", got)
	}
	all := sumHistogram(a, "lat", nil)
	if all.Count != 109 || all.counts[0] != 8 {
		t.Errorf("summed over both series: count %v, first bucket %v; want 109 and 8", all.Count, all.counts[0])
	}
	if q := (Histogram{}).Quantile(0.5); !math.IsNaN(q) {
		t.Errorf("quantile of no observations = %v, want NaN", q)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{"default", func(*Config) {}, ""},
		{"gang larger than the cluster", func(c *Config) { c.BigGang = 4001 }, "cannot hold"},
		{"gangs larger than the cluster", func(c *Config) { c.Gangs = 63 }, "cannot hold"},
		{"too many pods", func(c *Config) { c.Pods = 55001 }, "do not fit"},
		{"no queues", func(c *Config) { c.Queues = 0 }, "must be positive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.mutate(&c)
			err := c.Validate(8)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Validate() = %v, want %q", err, tc.wantErr)
			}
		})
	}
	if err := Small().Validate(8); err != nil {
		t.Errorf("the smoke variant is invalid: %v", err)
	}
}
