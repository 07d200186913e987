package plugin

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/node/prepare"
	"github.com/tessera-dev/tessera/pkg/node/timeslice"
)

// TestPrepareErrorsCountedByReason: the metric's reason label is the
// prepare error's Reason, through the wrapping the driver adds.
func TestPrepareErrorsCountedByReason(t *testing.T) {
	m := newMetrics(&Driver{})
	claim := &resourceapi.ResourceClaim{}
	for _, err := range []error{
		fmt.Errorf("prepare claim ns/a: %w", &prepare.ReasonError{Reason: prepare.ReasonMIG, Err: fmt.Errorf("MIG device gone")}),
		&timeslice.Conflict{GPU: "GPU-0", Requester: "ns/b"},
		fmt.Errorf("config in the message does not make it a config error"),
	} {
		m.observePrepare(claim, time.Millisecond, err)
	}
	m.observePrepare(claim, time.Millisecond, nil)
	for reason, want := range map[prepare.Reason]float64{
		prepare.ReasonMIG: 1, prepare.ReasonConflict: 1, prepare.ReasonOther: 1, prepare.ReasonConfig: 0,
	} {
		if got := testutil.ToFloat64(m.prepareErrors.WithLabelValues(string(reason))); got != want {
			t.Errorf("%s: %v, want %v", reason, got, want)
		}
	}
}
