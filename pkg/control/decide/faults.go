package decide

import (
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"strings"

	inf "gopkg.in/inf.v0"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-dev/tessera/pkg/control/podclaims"
	"github.com/tessera-dev/tessera/pkg/control/queue"
)

// Faults: why a workload is inadmissible because of what it asks for, as
// opposed to waiting. They are the values of Verdict.Fault and the reason
// label of the controller's tessera_controller_inadmissible_workloads
// gauge: a small, fixed set.
const (
	// FaultLabels: queue or gang labels that name no usable queue or gang.
	FaultLabels = "InvalidLabels"
	// FaultClaim: a claim the estimate refuses (a device class that does
	// not exist).
	FaultClaim = "InvalidClaim"
	// FaultSpec: a claim spec the allocator cannot take (no request kind,
	// an unknown allocation mode, a selector without CEL).
	FaultSpec = "InvalidSpec"
	// FaultCount: a device count below 1 or above what one claim can be
	// allocated (resource.k8s.io AllocationResultsMaxSize).
	FaultCount = "CountOutOfRange"
	// FaultCapacity: a capacity request that is negative or does not fit
	// in 64 bits.
	FaultCapacity = "CapacityOutOfRange"
	// FaultSelector: a CEL selector that does not compile or fails at run
	// time on a device the allocator meets.
	FaultSelector = "SelectorError"
	// FaultAllocator: any other error of the allocator.
	FaultAllocator = "AllocatorError"
	// FaultInternal: the decision about the workload panicked (a bug; the
	// workload is set aside so that the others are decided).
	FaultInternal = "InternalError"
)

// Faults lists every fault, for metrics.
var Faults = []string{FaultLabels, FaultClaim, FaultSpec, FaultCount, FaultCapacity, FaultSelector, FaultAllocator, FaultInternal}

// faultError is an error that makes one workload inadmissible.
type faultError struct {
	fault, msg string
}

func (e *faultError) Error() string { return e.msg }

// maxClaimDevices is the most devices one claim can be allocated.
const maxClaimDevices = resourceapi.AllocationResultsMaxSize

// checkClaim refuses a claim spec the allocator cannot take or can never
// satisfy, naming the field and the fix. The API server validates claims
// the same way; this holds for whatever reaches the controller (claims
// from older API versions, templates, tests, fuzzing).
func checkClaim(pc podclaims.PodClaim) *faultError {
	bad := func(fault, field, format string, args ...any) *faultError {
		return &faultError{fault, fmt.Sprintf("claim %s: %s %s", pc.Display, field, fmt.Sprintf(format, args...))}
	}
	spec := &pc.Claim.Spec
	var total int64
	for i, r := range spec.Devices.Requests {
		field := fmt.Sprintf("spec.devices.requests[%d]", i)
		switch {
		case r.Exactly != nil && len(r.FirstAvailable) > 0:
			return bad(FaultSpec, field, "sets both exactly and firstAvailable: set one")
		case r.Exactly != nil:
			e := r.Exactly
			if f := checkRequest(field+".exactly", e.DeviceClassName, e.Selectors, e.AllocationMode, e.Count, e.Capacity); f != nil {
				return bad(f.fault, "", "%s", f.msg)
			}
			if e.AllocationMode != resourceapi.DeviceAllocationModeAll {
				total += max(e.Count, 1)
			}
		case len(r.FirstAvailable) > 0:
			most := int64(0)
			for j, sub := range r.FirstAvailable {
				if f := checkRequest(fmt.Sprintf("%s.firstAvailable[%d]", field, j), sub.DeviceClassName, sub.Selectors, sub.AllocationMode, sub.Count, sub.Capacity); f != nil {
					return bad(f.fault, "", "%s", f.msg)
				}
				if sub.AllocationMode != resourceapi.DeviceAllocationModeAll {
					// The smallest alternative is what the claim needs at
					// least.
					if n := max(sub.Count, 1); j == 0 || n < most {
						most = n
					}
				}
			}
			total += most
		default:
			return bad(FaultSpec, field, "has neither exactly nor firstAvailable: set one")
		}
	}
	if total > maxClaimDevices {
		return bad(FaultCount, "spec.devices.requests", "ask for %d devices in all, more than the %d one claim can be allocated: split the claim", total, maxClaimDevices)
	}
	return nil
}

// checkRequest checks one request or subrequest; the message starts with
// the field.
func checkRequest(field, class string, selectors []resourceapi.DeviceSelector, mode resourceapi.DeviceAllocationMode, count int64, capacity *resourceapi.CapacityRequirements) *faultError {
	if class == "" {
		return &faultError{FaultSpec, field + ".deviceClassName is empty: name a device class"}
	}
	switch mode {
	case "", resourceapi.DeviceAllocationModeExactCount:
		if count < 0 || count > maxClaimDevices {
			return &faultError{FaultCount, fmt.Sprintf("%s.count is %d: it must be between 1 and %d, the most devices one claim can be allocated", field, count, maxClaimDevices)}
		}
	case resourceapi.DeviceAllocationModeAll:
	default:
		return &faultError{FaultSpec, fmt.Sprintf("%s.allocationMode %q is not supported: use ExactCount or All", field, mode)}
	}
	for k, s := range selectors {
		if s.CEL == nil {
			return &faultError{FaultSpec, fmt.Sprintf("%s.selectors[%d] has no cel: set cel.expression", field, k)}
		}
	}
	if capacity != nil {
		for name, q := range capacity.Requests {
			if !representable(q) {
				return &faultError{FaultCapacity, fmt.Sprintf("%s.capacity.requests[%s] is %s: it must be between 0 and %d", field, name, q.String(), int64(math.MaxInt64))}
			}
		}
	}
	return nil
}

// representable says whether a quantity is a non-negative amount that
// fits in an int64 once rounded up to units.
func representable(q resource.Quantity) bool {
	if q.Sign() < 0 {
		return false
	}
	if _, ok := q.AsInt64(); ok {
		return true
	}
	d := q.AsDec()
	return d.Cmp(inf.NewDec(math.MaxInt64, 0)) <= 0
}

// allocatorFault turns an error of the allocator during the simulation of
// a workload into its fault. The allocator's message names the pod's own
// claims (a pod can only use claims of its namespace), device classes and
// devices, never another namespace's objects.
func allocatorFault(w *Workload, err error) *faultError {
	var f *faultError
	if errors.As(err, &f) {
		return f
	}
	msg := err.Error()
	fault := FaultAllocator
	fix := "fix the claim"
	switch {
	case strings.Contains(msg, "CEL runtime error"), strings.Contains(msg, "CEL compile error"):
		fault = FaultSelector
		fix = "the scheduler cannot allocate a claim whose selector fails on a device it considers; fix the expression in the claim's (or the template's) spec.devices.requests[].exactly.selectors or firstAvailable[].selectors, e.g. guard attribute access with has() or the optional operator"
	case strings.Contains(msg, "count") && strings.Contains(msg, "too large"):
		fault = FaultCount
		fix = fmt.Sprintf("lower spec.devices.requests[].exactly.count to at most %d", maxClaimDevices)
	case strings.Contains(msg, "capacity"):
		fault = FaultCapacity
		fix = "fix the capacity requests of the claim"
	}
	return &faultError{fault, fmt.Sprintf("%s: the scheduler's allocator refuses its claims: %v; %s", w.Describe(), err, fix)}
}

// decideIsolated decides one pending workload; an error or a panic while
// doing so makes that workload inadmissible and the cycle goes on. Only a
// cancelled context stops the cycle.
func (c *cycle) decideIsolated(w *Workload, d queue.Vector, pass int) (deferred bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			c.logger.Error(fmt.Errorf("panic: %v", r), "Deciding a workload panicked; it is set aside", "workload", w.Key, "stack", string(debug.Stack()))
			c.faulted(w, &faultError{FaultInternal, fmt.Sprintf("%s: deciding it failed (an internal error, reported in the controller's log); it is retried in the next cycle", w.Describe())})
			deferred, err = false, nil
		}
	}()
	deferred, err = c.decide(w, d, pass)
	if err == nil {
		return deferred, nil
	}
	if ctxErr := c.ctx.Err(); ctxErr != nil {
		return false, ctxErr
	}
	c.logger.V(2).Info("Workload inadmissible", "workload", w.Key, "err", err)
	c.faulted(w, allocatorFault(w, err))
	return false, nil
}

// faulted records an inadmissible workload.
func (c *cycle) faulted(w *Workload, f *faultError) {
	c.countPending(w)
	c.verdict(&Verdict{Workload: w, Reason: ReasonInvalid, Message: f.msg, Invalid: true, Fault: f.fault})
}
