package controller

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tessera-dev/tessera/pkg/admission"
)

// TestInadmissibleMetric: the gauge holds the last cycle's inadmissible
// workloads by reason, every reason present, and falls back to 0.
func TestInadmissibleMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	snap := &admission.Snapshot{}
	d := &admission.Decision{Waiting: []*admission.Verdict{
		{Invalid: true, Fault: admission.FaultSelector},
		{Invalid: true, Fault: admission.FaultSelector},
		{Invalid: true, Fault: admission.FaultCount},
		{Invalid: true}, // no fault: counted as an invalid claim
		{Reason: admission.ReasonDoesNotFit},
	}}
	m.observe(snap, d, time.Millisecond)
	want := func(selector, count, claim int) string {
		var b strings.Builder
		b.WriteString("# HELP " + MetricInadmissibleWorkloads + " Workloads the last admission cycle found inadmissible as they are (bad labels, claims the scheduler's allocator refuses, selectors that fail), by reason; the other workloads are decided regardless.\n")
		b.WriteString("# TYPE " + MetricInadmissibleWorkloads + " gauge\n")
		n := map[string]int{admission.FaultSelector: selector, admission.FaultCount: count, admission.FaultClaim: claim}
		for _, f := range []string{admission.FaultAllocator, admission.FaultCapacity, admission.FaultCount, admission.FaultInternal, admission.FaultClaim, admission.FaultLabels, admission.FaultSpec, admission.FaultSelector} {
			b.WriteString(MetricInadmissibleWorkloads + `{reason="` + f + `"} ` + strconv.Itoa(n[f]) + "\n")
		}
		return b.String()
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(2, 1, 1)), MetricInadmissibleWorkloads); err != nil {
		t.Error(err)
	}
	m.observe(snap, &admission.Decision{}, time.Millisecond)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(0, 0, 0)), MetricInadmissibleWorkloads); err != nil {
		t.Error(err)
	}
}
