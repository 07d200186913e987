package prepare

import (
	"errors"

	"github.com/tessera-dev/tessera/pkg/node/timeslice"
)

// Reason is the bounded class of a prepare failure (the plugin's
// tessera_prepare_errors_total label).
type Reason string

// The reasons of prepare failures.
const (
	// ReasonConflict: the devices are held by another claim (capacity,
	// a share or time slice prepared twice, a time-slice interval).
	ReasonConflict Reason = "conflict"
	// ReasonMIG: a MIG device could not be found, adopted or created.
	ReasonMIG Reason = "mig"
	// ReasonEnforcement: the limits cannot be enforced as configured (a
	// floor the claim or the node does not meet).
	ReasonEnforcement Reason = "enforcement"
	// ReasonConfig: the claim's or DeviceClass's GpuConfig is invalid.
	ReasonConfig Reason = "config"
	// ReasonOther: anything else.
	ReasonOther Reason = "other"
)

// ReasonError gives a prepare failure its Reason. Its message is Err's,
// unchanged.
type ReasonError struct {
	Reason Reason
	Err    error
}

func (e *ReasonError) Error() string { return e.Err.Error() }

func (e *ReasonError) Unwrap() error { return e.Err }

// withReason wraps err (nil stays nil).
func withReason(r Reason, err error) error {
	if err == nil {
		return nil
	}
	return &ReasonError{Reason: r, Err: err}
}

// ReasonOf tells why a prepare failed: the outermost ReasonError in err's
// chain, a time-slice interval conflict, or ReasonOther.
func ReasonOf(err error) Reason {
	var re *ReasonError
	if errors.As(err, &re) {
		return re.Reason
	}
	var conflict *timeslice.Conflict
	if errors.As(err, &conflict) {
		return ReasonConflict
	}
	return ReasonOther
}
