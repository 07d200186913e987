package controller

import (
	"context"
	"encoding/json"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/history"
	"github.com/tessera-dev/tessera/pkg/control/sliceintern"
)

// HistoryKeeper updates every queue's usage history (status.usage) every
// --usage-history-interval, on the leader only: it integrates the rates
// the previous update recorded up to now (from the status, so that a new
// leader or a restarted controller continues where the last one stopped,
// for at most --usage-max-gap of a longer gap) and records the rates it
// observes now. It writes only status.usage, with a merge patch; the
// admission loop carries status.usage over when it rewrites the status.
//
// Updates run at whole seconds (status.usage.lastUpdated has second
// precision), so that consecutive updates integrate adjoining intervals
// and no part of a second twice. Where the cached status is older than
// what this process wrote last (the watch has not delivered the patch
// yet), it continues from what it wrote, not from the older status, which
// would integrate that stretch again.
type HistoryKeeper struct {
	Client client.Client
	Reader client.Reader
	// Attributes reads the devices' attributes of Reader's slices (the
	// cache's compact form; nil: the slices carry them).
	Attributes *sliceintern.Interner
	Config     history.Config
	Every      time.Duration
	Now        func() time.Time

	// written is status.usage as this process last wrote it, by queue
	// UID. Only the Start loop calls Update: no lock.
	written map[types.UID]*v1alpha1.QueueUsage
	// Controller is this controller's --controller-name: it writes only
	// its own queues' history (canary queues: owner.go).
	Controller string
}

// NeedLeaderElection: only the leader writes history.
func (h *HistoryKeeper) NeedLeaderElection() bool { return true }

// Start updates until ctx ends.
func (h *HistoryKeeper) Start(ctx context.Context) error {
	t := time.NewTicker(h.Every)
	defer t.Stop()
	for {
		if err := h.Update(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Updating queue usage history failed; retrying")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Update runs one update.
func (h *HistoryKeeper) Update(ctx context.Context) error {
	now := time.Now
	if h.Now != nil {
		now = h.Now
	}
	var (
		queues     v1alpha1.QueueList
		pods       corev1.PodList
		claims     resourceapi.ResourceClaimList
		slices     resourceapi.ResourceSliceList
		namespaces corev1.NamespaceList
	)
	// Claims, slices, pods and namespaces are only read (history.Rates):
	// the cache's objects as they are, not a copy of every published
	// device at each sample. Queues are copies: their status is read
	// against what this sampler wrote.
	if err := h.Reader.List(ctx, &queues); err != nil {
		return err
	}
	for _, l := range []client.ObjectList{&claims, &slices} {
		if err := h.Reader.List(ctx, l, client.UnsafeDisableDeepCopy); err != nil {
			return err
		}
	}
	if err := h.Reader.List(ctx, &pods, client.HasLabels{v1alpha1.QueueLabel}, client.UnsafeDisableDeepCopy); err != nil {
		return err
	}
	if err := h.Reader.List(ctx, &namespaces, client.HasLabels{v1alpha1.QueueLabel}, client.UnsafeDisableDeepCopy); err != nil {
		return err
	}
	qs := ptrs(queues.Items)
	rates := history.Rates(qs, ptrs(pods.Items), ptrs(claims.Items), ptrs(slices.Items), h.Attributes, ptrs(namespaces.Items))
	t := now().Truncate(time.Second)
	if h.written == nil {
		h.written = map[types.UID]*v1alpha1.QueueUsage{}
	}
	owner := newOwnership(h.Controller, qs)
	seen := map[types.UID]bool{}
	for _, q := range qs {
		if !owner.queue(q.Name) {
			continue
		}
		seen[q.UID] = true
		usage := q.Status.Usage
		if w := h.written[q.UID]; w != nil && (usage == nil || usage.LastUpdated.Before(&w.LastUpdated)) {
			usage = w
		}
		hist := history.FromStatus(usage, t)
		hist.Update(t, rates[q.Name], h.Config)
		next := hist.ToStatus(h.Config)
		if q.Status.Usage != nil && apiequality.Semantic.DeepEqual(q.Status.Usage, next) {
			continue
		}
		data, err := json.Marshal(map[string]any{"status": map[string]any{"usage": next}})
		if err != nil {
			return err
		}
		target := &v1alpha1.Queue{}
		target.Name = q.Name
		if err := h.Client.Status().Patch(ctx, target, client.RawPatch(types.MergePatchType, data)); err != nil {
			if !apierrors.IsNotFound(err) {
				klog.FromContext(ctx).Error(err, "Writing queue usage history failed", "queue", q.Name)
			}
			continue
		}
		h.written[q.UID] = next
	}
	for uid := range h.written {
		if !seen[uid] {
			delete(h.written, uid)
		}
	}
	return nil
}

func ptrs[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}
