package scale

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/rest"
)

// families are one scrape of a /metrics endpoint.
type families map[string]*dto.MetricFamily

// endpoint is a /metrics endpoint and the HTTP client that may read it.
type endpoint struct {
	name, url string
	client    *http.Client
}

// endpoints are every endpoint a run reads: the API server, the scheduler
// and the controller-manager (with the admin's client certificate; their
// serving certificates are self-signed) and Tessera's controller.
func endpoints(admin *rest.Config, controllerURL string, ports map[string]int) ([]endpoint, error) {
	apiClient, err := rest.HTTPClientFor(admin)
	if err != nil {
		return nil, err
	}
	insecure := rest.CopyConfig(admin)
	insecure.Insecure, insecure.CAData, insecure.CAFile = true, nil, ""
	compClient, err := rest.HTTPClientFor(insecure)
	if err != nil {
		return nil, err
	}
	eps := []endpoint{
		{name: "apiserver", url: strings.TrimSuffix(admin.Host, "/") + "/metrics", client: apiClient},
		{name: "controller", url: controllerURL, client: http.DefaultClient},
	}
	for name, port := range ports {
		eps = append(eps, endpoint{name: name, url: fmt.Sprintf("https://127.0.0.1:%d/metrics", port), client: compClient})
	}
	return eps, nil
}

// scrapeAll reads every endpoint; a snapshot maps endpoint name to families.
func scrapeAll(ctx context.Context, eps []endpoint) (map[string]families, error) {
	out := map[string]families{}
	for _, ep := range eps {
		f, err := scrape(ctx, ep)
		if err != nil {
			return nil, err
		}
		out[ep.name] = f
	}
	return out, nil
}

func scrape(ctx context.Context, ep endpoint) (families, error) {
	body, err := ep.get(ctx, ep.url, 30*time.Second)
	if err != nil {
		return nil, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	f, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parsing %s metrics: %w", ep.name, err)
	}
	return f, nil
}

// get reads url (the endpoint's own or one beside it) with the endpoint's
// client within timeout; anything but 200 OK is an error naming it.
func (ep endpoint) get(ctx context.Context, url string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := ep.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading %s (%s): %w", ep.name, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading %s (%s): %s: %s", ep.name, url, resp.Status, bytes.TrimSpace(body))
	}
	return body, nil
}

func labels(m *dto.Metric) map[string]string {
	l := make(map[string]string, len(m.GetLabel()))
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

// sumCounter adds up the counter (or untyped) samples of name whose labels
// match.
func sumCounter(f families, name string, match func(map[string]string) bool) float64 {
	total := 0.0
	for _, m := range f[name].GetMetric() {
		if match != nil && !match(labels(m)) {
			continue
		}
		total += m.GetCounter().GetValue() + m.GetUntyped().GetValue()
	}
	return total
}

// Histogram is a cumulative histogram: the count of observations up to
// each upper bound, plus the total count and sum.
type Histogram struct {
	bounds []float64
	counts []float64
	Count  float64
	sum    float64
}

// sumHistogram adds up the Histogram series of name whose labels match.
func sumHistogram(f families, name string, match func(map[string]string) bool) Histogram {
	var h Histogram
	idx := map[float64]int{}
	for _, m := range f[name].GetMetric() {
		if match != nil && !match(labels(m)) {
			continue
		}
		hh := m.GetHistogram()
		h.Count += float64(hh.GetSampleCount())
		h.sum += hh.GetSampleSum()
		for _, b := range hh.GetBucket() {
			i, ok := idx[b.GetUpperBound()]
			if !ok {
				i = len(h.bounds)
				idx[b.GetUpperBound()] = i
				h.bounds = append(h.bounds, b.GetUpperBound())
				h.counts = append(h.counts, 0)
			}
			h.counts[i] += float64(b.GetCumulativeCount())
		}
	}
	order := make([]int, len(h.bounds))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return h.bounds[order[a]] < h.bounds[order[b]] })
	sorted := Histogram{Count: h.Count, sum: h.sum}
	for _, i := range order {
		sorted.bounds = append(sorted.bounds, h.bounds[i])
		sorted.counts = append(sorted.counts, h.counts[i])
	}
	return sorted
}

// minus is the Histogram of the observations made between before and h.
func (h Histogram) minus(before Histogram) Histogram {
	d := Histogram{Count: h.Count - before.Count, sum: h.sum - before.sum, bounds: h.bounds}
	prev := map[float64]float64{}
	for i, b := range before.bounds {
		prev[b] = before.counts[i]
	}
	for i, b := range h.bounds {
		d.counts = append(d.counts, h.counts[i]-prev[b])
	}
	return d
}

// quantile estimates quantile q as Prometheus' histogram_quantile does
// (linear within the bucket); NaN without observations.
func (h Histogram) Quantile(q float64) float64 {
	if h.Count <= 0 {
		return math.NaN()
	}
	rank := q * h.Count
	lower, below := 0.0, 0.0
	for i, b := range h.bounds {
		if h.counts[i] >= rank {
			if math.IsInf(b, 1) {
				return b // beyond the highest finite bound (TopBound)
			}
			if h.counts[i] == below {
				return b
			}
			return lower + (b-lower)*(rank-below)/(h.counts[i]-below)
		}
		lower, below = b, h.counts[i]
	}
	return lower
}

// TopBound is the highest finite bucket bound.
func (h Histogram) TopBound() float64 {
	top := 0.0
	for _, b := range h.bounds {
		if !math.IsInf(b, 1) {
			top = max(top, b)
		}
	}
	return top
}

func (h Histogram) Mean() float64 {
	if h.Count <= 0 {
		return math.NaN()
	}
	return h.sum / h.Count
}

// writeVerbs are the API server's mutating verbs (apiserver_request_total
// and client-go's rest_client_requests_total spell them alike).
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "DELETE": true, "APPLY": true}

// RequestGroup is one (verb, resource, subresource) of the API server's
// requests with its count in a run.
type RequestGroup struct {
	Verb, Resource, Subresource string
	Count                       float64
}

func (g RequestGroup) String() string {
	r := g.Resource
	if g.Subresource != "" {
		r += "/" + g.Subresource
	}
	return g.Verb + " " + r
}

// apiRequests returns the API server's requests between two scrapes by
// (verb, resource, subresource), largest first, and their total.
func apiRequests(before, after families, writesOnly bool) ([]RequestGroup, float64) {
	const name = "apiserver_request_total"
	key := func(l map[string]string) RequestGroup {
		return RequestGroup{Verb: l["verb"], Resource: l["resource"], Subresource: l["subresource"]}
	}
	counts := map[RequestGroup]float64{}
	add := func(f families, sign float64) {
		for _, m := range f[name].GetMetric() {
			l := labels(m)
			if writesOnly && !writeVerbs[l["verb"]] {
				continue
			}
			counts[key(l)] += sign * m.GetCounter().GetValue()
		}
	}
	add(after, 1)
	add(before, -1)
	var out []RequestGroup
	total := 0.0
	for g, n := range counts {
		if n <= 0 {
			continue
		}
		g.Count = n
		out = append(out, g)
		total += n
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].String() < out[j].String()
	})
	return out, total
}

// clientWrites counts the mutating requests a component's client-go made
// (rest_client_requests_total) between two scrapes.
func clientWrites(before, after families) float64 {
	isWrite := func(l map[string]string) bool { return writeVerbs[l["method"]] }
	const name = "rest_client_requests_total"
	return sumCounter(after, name, isWrite) - sumCounter(before, name, isWrite)
}
