package commands

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/history"
)

// ReportRow is one line of the chargeback report.
type ReportRow struct {
	Queue, Namespace, Model string
	history.Amounts
	// Cost is the allocated GPU-hours times the model's price; NaN when
	// no price applies.
	Cost float64
}

// Prices map a lower-case model substring ("h100") to a price per
// GPU-hour.
type Prices map[string]float64

// ParsePrices reads "h100=2.50/h,t4=0.35/h" (the "/h" is optional).
func ParsePrices(s string) (Prices, error) {
	p := Prices{}
	if s == "" {
		return p, nil
	}
	for _, item := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(item), "=")
		v = strings.TrimSuffix(v, "/h")
		f, err := strconv.ParseFloat(v, 64)
		if !ok || k == "" || err != nil || f < 0 {
			return nil, fmt.Errorf("--price %q: use model=price/h, e.g. h100=2.50/h,t4=0.35/h", item)
		}
		p[strings.ToLower(k)] = f
	}
	return p, nil
}

// Of is the price of a model: the longest key it contains.
func (p Prices) Of(model string) (float64, bool) {
	best, price := "", 0.0
	if v, ok := p["*"]; ok {
		best, price = "*", v
	}
	for k, v := range p {
		if k == "*" {
			continue
		}
		if strings.Contains(strings.ToLower(model), k) && len(k) > len(best) {
			best, price = k, v
		}
	}
	return price, best != ""
}

// ReportFromStatus sums the leaf queues' daily buckets (status.usage.days)
// from since's UTC day on: parent queues' histories repeat their
// children's and are left out. It also returns notes on what the history
// cannot answer.
func ReportFromStatus(queues []v1alpha1.Queue, since time.Time, prices Prices) ([]ReportRow, []string) {
	parents := map[string]bool{}
	for _, q := range queues {
		if q.Spec.Parent != "" {
			parents[q.Spec.Parent] = true
		}
	}
	var rows []ReportRow
	var notes []string
	for _, q := range queues {
		if parents[q.Name] {
			continue
		}
		if q.Status.Usage == nil {
			notes = append(notes, fmt.Sprintf("queue %s has no usage history yet", q.Name))
			continue
		}
		sums, covered := history.Window(q.Status.Usage, since)
		if !covered {
			notes = append(notes, fmt.Sprintf("queue %s: the history does not reach back to %s (it started %s; %d days are kept)", q.Name,
				since.UTC().Format(time.DateOnly), q.Status.Usage.Since.UTC().Format(time.RFC3339), q.Status.Usage.RetainedDays))
		}
		for k, a := range sums {
			rows = append(rows, ReportRow{Queue: q.Name, Namespace: k.Namespace, Model: k.Model, Amounts: a, Cost: cost(prices, k.Model, a.AllocGPU)})
		}
	}
	sortRows(rows)
	return rows, notes
}

func cost(p Prices, model string, gpuHours float64) float64 {
	if price, ok := p.Of(model); ok {
		return price * gpuHours
	}
	return math.NaN()
}

func sortRows(rows []ReportRow) {
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.Queue != b.Queue {
			return a.Queue < b.Queue
		}
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Model < b.Model
	})
}

// PromQL are the queries the report runs against Prometheus, %s the range
// (e.g. 7d): a 1-minute subquery over each gauge, each sample counting a
// minute. Per namespace from the kubelet plugins' claim gauges (model
// "all": they carry none); queue rows from the controller's queue gauges
// (namespace "all").
var PromQL = map[string]string{
	"ns_alloc_mem": `sum by (namespace) (sum_over_time(tessera_claim_memory_allocated_bytes[%s:1m])) / 60 / 2^30`,
	"ns_used_mem":  `sum by (namespace) (sum_over_time(tessera_claim_memory_used_bytes[%s:1m])) / 60 / 2^30`,
	"ns_used_gpu":  `sum by (namespace) (sum_over_time(tessera_claim_sm_utilization_percent[%s:1m])) / 100 / 60`,
	"q_alloc_gpu":  `sum by (queue) (sum_over_time(tessera_queue_resource_usage{resource="gpu.tessera.dev/gpus"}[%s:1m])) / 60`,
	"q_alloc_mem":  `sum by (queue) (sum_over_time(tessera_queue_resource_usage{resource="gpu.tessera.dev/memory"}[%s:1m])) / 60 / 2^30`,
	"q_used_mem":   `sum by (queue) (sum_over_time(tessera_queue_memory_used_bytes[%s:1m])) / 60 / 2^30`,
}

// PromInstant runs an instant query against the Prometheus HTTP API and
// returns each series' value by the label given.
func PromInstant(ctx context.Context, c *http.Client, base, query, label string) (map[string]float64, error) {
	u := strings.TrimSuffix(base, "/") + "/api/v1/query?" + url.Values{"query": {query}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&body); err != nil {
		return nil, fmt.Errorf("prometheus %s: %s: %w", query, resp.Status, err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("prometheus %s: %s %s", query, resp.Status, body.Error)
	}
	out := map[string]float64{}
	for _, r := range body.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("prometheus %s: value %v", query, r.Value[1])
		}
		out[r.Metric[label]] = v
	}
	return out, nil
}

// ReportFromPrometheus builds the report over the range (a Prometheus
// duration, e.g. 7d). Prometheus knows no GPU model here: only a "*"
// price applies, to the queue rows.
func ReportFromPrometheus(ctx context.Context, c *http.Client, base, rng string, prices Prices) ([]ReportRow, error) {
	get := func(key, label string) (map[string]float64, error) {
		return PromInstant(ctx, c, base, fmt.Sprintf(PromQL[key], rng), label)
	}
	res := map[string]map[string]float64{}
	for key := range PromQL {
		label := "namespace"
		if strings.HasPrefix(key, "q_") {
			label = "queue"
		}
		m, err := get(key, label)
		if err != nil {
			return nil, err
		}
		res[key] = m
	}
	var rows []ReportRow
	for q, v := range res["q_alloc_gpu"] {
		a := history.Amounts{AllocGPU: v, AllocMem: res["q_alloc_mem"][q], UsedMem: res["q_used_mem"][q]}
		rows = append(rows, ReportRow{Queue: q, Namespace: "all", Model: "all", Amounts: a, Cost: cost(prices, "*", a.AllocGPU)})
	}
	for ns, v := range res["ns_alloc_mem"] {
		a := history.Amounts{AllocMem: v, UsedMem: res["ns_used_mem"][ns], UsedGPU: res["ns_used_gpu"][ns]}
		rows = append(rows, ReportRow{Queue: "-", Namespace: ns, Model: "all", Amounts: a, Cost: math.NaN()})
	}
	sortRows(rows)
	return rows, nil
}

// PrintReport writes the rows as a table, csv or markdown (csv with 6
// decimals, the others with 2).
func PrintReport(w io.Writer, rows []ReportRow, format string, withCost bool) error {
	head := []string{"QUEUE", "NAMESPACE", "MODEL", "GPU-H ALLOC", "GPU-H USED", "GPU-H WASTE", "GIB-H ALLOC", "GIB-H USED", "GIB-H WASTE"}
	if withCost {
		head = append(head, "COST")
	}
	// Tables and markdown are read by people (2 decimals); csv is read by
	// programs and keeps the 6 decimals status.usage holds.
	prec := 2
	if format == "csv" {
		prec = 6
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	var lines [][]string
	var total history.Amounts
	totalCost := 0.0
	for _, r := range rows {
		w := r.Waste()
		l := []string{r.Queue, r.Namespace, r.Model, f(r.AllocGPU), f(r.UsedGPU), f(w.AllocGPU), f(r.AllocMem), f(r.UsedMem), f(w.AllocMem)}
		if withCost {
			c := "-"
			if !math.IsNaN(r.Cost) {
				c = f(r.Cost)
				totalCost += r.Cost
			}
			l = append(l, c)
		}
		lines = append(lines, l)
		total = total.Add(r.Amounts)
	}
	switch format {
	case "csv":
		cw := csv.NewWriter(w)
		_ = cw.Write(head)
		_ = cw.WriteAll(lines)
		return cw.Error()
	case "markdown":
		fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(head, " | "), strings.Repeat("---|", len(head)))
		for _, l := range lines {
			fmt.Fprintf(w, "| %s |\n", strings.Join(l, " | "))
		}
		return nil
	case "table", "":
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(head, "\t"))
		for _, l := range lines {
			fmt.Fprintln(tw, strings.Join(l, "\t"))
		}
		tl := []string{"TOTAL", "", "", f(total.AllocGPU), f(total.UsedGPU), f(total.Waste().AllocGPU), f(total.AllocMem), f(total.UsedMem), f(total.Waste().AllocMem)}
		if withCost {
			tl = append(tl, f(totalCost))
		}
		fmt.Fprintln(tw, strings.Join(tl, "\t"))
		return tw.Flush()
	}
	return fmt.Errorf("-o %q: use table, csv or markdown", format)
}

// ParseSince reads 7d, 36h, 90m.
func ParseSince(s string) (time.Duration, error) {
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(d)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("--since %q: use e.g. 7d, 36h", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("--since %q: use e.g. 7d, 36h", s)
	}
	return d, nil
}

func newReportCommand(o *Options, s Streams) *cobra.Command {
	var since, price, output, promURL string
	cmd := &cobra.Command{
		Use:   "report",
		Short: "Chargeback: GPU-hours and GPU memory GiB-hours per queue and namespace, allocated, used, waste, cost",
		Long: `Per leaf queue, namespace and GPU model: allocated and used GPU-hours and
GPU memory GiB-hours, the waste (allocated minus used) and, with --price,
the cost of the allocated GPU-hours.

Without --prometheus-url it reads the queues' usage history
(Queue status.usage.days, daily UTC buckets the controller keeps for
--usage-history-days): --since counts whole UTC days, from the day that
--since ago falls on, and a note says when the history does not reach back
that far. With --prometheus-url it runs the PromQL of
docs/observability.md over exactly --since (per queue and per namespace,
no GPU model: a price "*=..." applies).`,
		Example: `  kubectl tessera report --since 7d --price h100=2.50/h,t4=0.35/h
  kubectl tessera report --since 30d -o csv
  kubectl tessera report --since 7d --prometheus-url http://127.0.0.1:9090 --price '*=1.20/h'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := ParseSince(since)
			if err != nil {
				return err
			}
			prices, err := ParsePrices(price)
			if err != nil {
				return err
			}
			if output != "table" && output != "csv" && output != "markdown" {
				return fmt.Errorf("-o %q: use table, csv or markdown", output)
			}
			ctx := cmd.Context()
			var rows []ReportRow
			if promURL != "" {
				rng := strings.TrimSuffix(since, "d")
				if rng != since {
					rng += "d"
				}
				if rows, err = ReportFromPrometheus(ctx, http.DefaultClient, promURL, rng, prices); err != nil {
					return err
				}
			} else {
				cfg, _, err := o.ClientConfig()
				if err != nil {
					return err
				}
				dc, err := dynamic.NewForConfig(cfg)
				if err != nil {
					return err
				}
				list, err := dc.Resource(schema.GroupVersionResource{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Resource: "queues"}).List(ctx, metav1.ListOptions{})
				if err != nil {
					return err
				}
				var queues []v1alpha1.Queue
				for _, item := range list.Items {
					var q v1alpha1.Queue
					if err := runtime.DefaultUnstructuredConverter.FromUnstructured(item.Object, &q); err != nil {
						return err
					}
					queues = append(queues, q)
				}
				var notes []string
				rows, notes = ReportFromStatus(queues, time.Now().Add(-d), prices)
				for _, n := range notes {
					fmt.Fprintln(s.Err, "note:", n)
				}
			}
			return PrintReport(s.Out, rows, output, len(prices) > 0)
		},
	}
	f := cmd.Flags()
	f.StringVar(&since, "since", "7d", "The window: 7d, 36h.")
	f.StringVar(&price, "price", "", "Prices per GPU-hour by model substring, e.g. h100=2.50/h,t4=0.35/h ('*' matches any model).")
	f.StringVarP(&output, "output", "o", "table", "table, csv or markdown.")
	f.StringVar(&promURL, "prometheus-url", "", "Read from Prometheus (its HTTP API) instead of the queues' history.")
	return cmd
}
