package webhook

import (
	"context"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// A review whose context the stopping manager cancelled is still
// answered, on a context that has a deadline.
func TestDetachedOutlivesShutdown(t *testing.T) {
	type key struct{}
	var (
		got context.Context
		err error
	)
	h := Detached(admission.HandlerFunc(func(ctx context.Context, _ admission.Request) admission.Response {
		got, err = ctx, ctx.Err()
		return admission.Allowed("")
	}))
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	cancel()
	if r := h.Handle(ctx, admission.Request{}); !r.Allowed {
		t.Fatalf("response %+v", r)
	}
	if err != nil {
		t.Errorf("the handler's context is done: %v", err)
	}
	if d, ok := got.Deadline(); !ok || time.Until(d) > MaxReview {
		t.Errorf("deadline %v (set: %v), want within %v", d, ok, MaxReview)
	}
	if got.Value(key{}) != "v" {
		t.Error("the request's values are lost")
	}
}
