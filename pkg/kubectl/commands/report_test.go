package commands

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/history"
)

func TestParsePrices(t *testing.T) {
	tests := []struct {
		in      string
		model   string
		want    float64
		ok, err bool
	}{
		{"h100=2.50/h,t4=0.35/h", "NVIDIA H100 80GB HBM3", 2.5, true, false},
		{"h100=2.50/h,t4=0.35/h", "Tesla T4", 0.35, true, false},
		{"h100=2.50/h", "Tesla T4", 0, false, false},
		{"*=1,t4=0.35", "NVIDIA A100", 1, true, false},
		{"h100", "", 0, false, true},
		{"h100=-1/h", "", 0, false, true},
	}
	for _, tt := range tests {
		p, err := ParsePrices(tt.in)
		if (err != nil) != tt.err {
			t.Fatalf("ParsePrices(%q) err %v", tt.in, err)
		}
		if err != nil {
			continue
		}
		if got, ok := p.Of(tt.model); got != tt.want || ok != tt.ok {
			t.Errorf("%q Of(%q) = %v %v, want %v %v", tt.in, tt.model, got, ok, tt.want, tt.ok)
		}
	}
}

func TestReportFromStatus(t *testing.T) {
	cfg := history.Config{MaxGap: 48 * time.Hour, Days: 7}
	t0 := time.Date(2025, 3, 10, 12, 0, 0, 0, time.UTC)
	h := history.New(t0)
	h.Update(t0, map[history.Key]history.Amounts{
		{Namespace: "team-a", Model: "NVIDIA H100"}: {AllocGPU: 1, UsedGPU: 0.25, AllocMem: 80, UsedMem: 20},
		{Namespace: "team-b", Model: "Tesla T4"}:    {AllocGPU: 0.5, AllocMem: 8},
	}, cfg)
	h.Update(t0.Add(10*time.Hour), nil, cfg)
	leaf := v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "ml"}, Spec: v1alpha1.QueueSpec{Parent: "root"}}
	leaf.Status.Usage = h.ToStatus(cfg)
	root := v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "root"}}
	root.Status.Usage = leaf.Status.Usage // parents repeat children: not counted
	prices, _ := ParsePrices("h100=2.50/h")
	rows, notes := ReportFromStatus([]v1alpha1.Queue{root, leaf}, t0, prices)
	if len(notes) != 0 || len(rows) != 2 {
		t.Fatalf("rows %+v notes %v", rows, notes)
	}
	if r := rows[0]; r.Namespace != "team-a" || r.AllocGPU != 10 || r.UsedGPU != 2.5 || r.AllocMem != 800 || r.Cost != 25 {
		t.Errorf("team-a row %+v", r)
	}
	if r := rows[1]; r.Namespace != "team-b" || r.AllocGPU != 5 || !math.IsNaN(r.Cost) {
		t.Errorf("team-b row %+v", r)
	}
	if _, notes := ReportFromStatus([]v1alpha1.Queue{leaf}, t0.Add(-72*time.Hour), prices); len(notes) != 1 {
		t.Errorf("a window before the history must say so: %v", notes)
	}
	for _, format := range []string{"table", "csv", "markdown"} {
		var b bytes.Buffer
		if err := PrintReport(&b, rows, format, true); err != nil || !strings.Contains(b.String(), "team-a") || !strings.Contains(b.String(), "25.00") {
			t.Errorf("%s: %v\n%s", format, err, b.String())
		}
	}
	// csv keeps what status.usage holds (6 decimals), so that short
	// windows are not rounded away.
	var b bytes.Buffer
	small := []ReportRow{{Queue: "q", Namespace: "ns", Model: "Tesla T4", Amounts: history.Amounts{AllocGPU: 0.006667, AllocMem: 0.1}}}
	if err := PrintReport(&b, small, "csv", false); err != nil || !strings.Contains(b.String(), "q,ns,Tesla T4,0.006667,0.000000,0.006667,0.100000,") {
		t.Errorf("csv: %v\n%s", err, b.String())
	}
}

func TestReportFromPrometheus(t *testing.T) {
	var queries []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query().Get("query")
		queries = append(queries, q)
		label, value := "namespace", "team-a"
		if strings.Contains(q, "by (queue)") {
			label, value = "queue", "ml"
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": map[string]any{"resultType": "vector",
			"result": []any{map[string]any{"metric": map[string]string{label: value}, "value": []any{1.0, "12.5"}}}}})
	}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = l
	srv.Start()
	defer srv.Close()
	prices, _ := ParsePrices("*=2/h")
	rows, err := ReportFromPrometheus(context.Background(), srv.Client(), srv.URL, "7d", prices)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[1].Queue != "ml" || rows[1].AllocGPU != 12.5 || rows[1].Cost != 25 || rows[0].Namespace != "team-a" || rows[0].UsedGPU != 12.5 {
		t.Errorf("rows %+v", rows)
	}
	if len(queries) != len(PromQL) || !strings.Contains(queries[0], "[7d:1m]") {
		t.Errorf("queries %v", queries)
	}
}
