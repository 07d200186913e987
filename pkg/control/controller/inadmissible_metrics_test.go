package controller

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tessera-dev/tessera/pkg/control/decide"
)

// TestInadmissibleMetric: the gauge holds the last cycle's inadmissible
// workloads by reason, every reason present, and falls back to 0.
func TestInadmissibleMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	snap := &decide.Snapshot{}
	d := &decide.Decision{Waiting: []*decide.Verdict{
		{Invalid: true, Fault: decide.FaultSelector},
		{Invalid: true, Fault: decide.FaultSelector},
		{Invalid: true, Fault: decide.FaultCount},
		{Invalid: true}, // no fault: counted as an invalid claim
		{Reason: decide.ReasonDoesNotFit},
	}}
	m.observe(snap, d, time.Millisecond)
	want := func(selector, count, claim int) string {
		var b strings.Builder
		b.WriteString("# HELP " + MetricInadmissibleWorkloads + " Workloads the last admission cycle found inadmissible as they are (bad labels, claims the scheduler's allocator refuses, selectors that fail), by reason; the other workloads are decided regardless.\n")
		b.WriteString("# TYPE " + MetricInadmissibleWorkloads + " gauge\n")
		n := map[string]int{decide.FaultSelector: selector, decide.FaultCount: count, decide.FaultClaim: claim}
		for _, f := range []string{decide.FaultAllocator, decide.FaultCapacity, decide.FaultCount, decide.FaultInternal, decide.FaultClaim, decide.FaultLabels, decide.FaultSpec, decide.FaultSelector} {
			b.WriteString(MetricInadmissibleWorkloads + `{reason="` + f + `"} ` + strconv.Itoa(n[f]) + "\n")
		}
		return b.String()
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(2, 1, 1)), MetricInadmissibleWorkloads); err != nil {
		t.Error(err)
	}
	m.observe(snap, &decide.Decision{}, time.Millisecond)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(0, 0, 0)), MetricInadmissibleWorkloads); err != nil {
		t.Error(err)
	}
}
