package webhook

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// MaxReview bounds an admission review: the API server waits at most 30s
// for any webhook (timeoutSeconds).
const MaxReview = 30 * time.Second

// Detached answers reviews in flight when the controller stops.
// controller-runtime's server derives each request's context from the
// manager's, so a rollout's SIGTERM cancels the reviews it is still
// serving (while http.Server.Shutdown waits for them) and a handler that
// reads the API would refuse them: a Queue applied in the same helm
// upgrade that replaces the controller was refused with "context
// canceled". The handler runs on the request's context without that
// cancellation, bounded by MaxReview.
func Detached(h admission.Handler) admission.Handler {
	return admission.HandlerFunc(func(ctx context.Context, req admission.Request) admission.Response {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), MaxReview)
		defer cancel()
		return h.Handle(ctx, req)
	})
}
