package plugin

import (
	"context"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/node/prepare"
)

// statusFieldManager owns the plugin's entries in status.devices.
const statusFieldManager = "gpu.tessera.dev/kubelet-plugin"

// maxStatusRetries bounds how often a failed status write is retried.
const maxStatusRetries = 8

// statusWriter writes status.devices of prepared claims in the
// background, so that prepare never waits for the API server. It reads the
// claim, replaces this driver's entries (other drivers' stay as they are)
// and updates the status with the claim's resourceVersion, retrying on
// conflicts. It does not use server-side apply: the API server's apply
// round-trips the whole status through its typed representation, which
// re-encodes the opaque parameters in status.allocation (a RawExtension)
// with sorted keys; when the user wrote them in another order the
// allocation then differs from the stored one and the write is refused as
// a change of an immutable field. Writing needs RBAC on
// resourceclaims/status (update) and on the synthetic resourceclaims/driver
// subresource (verb associated-node:update, resourceNames gpu.tessera.dev). A failure is logged and retried a few
// times; it never fails prepare: the status is information for users, the
// CDI spec is what the workload gets.
type statusWriter struct {
	client kubernetes.Interface
	driver string
	queue  workqueue.TypedRateLimitingInterface[types.UID]

	mu      sync.Mutex
	desired map[types.UID]statusEntry
}

type statusEntry struct {
	claim   types.NamespacedName
	devices []resourceapi.AllocatedDeviceStatus
}

var _ prepare.StatusWriter = (*statusWriter)(nil)

func newStatusWriter(client kubernetes.Interface, driver string) *statusWriter {
	return &statusWriter{
		client: client, driver: driver, desired: map[types.UID]statusEntry{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[types.UID](),
			workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: "claim-status"}),
	}
}

// Set implements prepare.StatusWriter.
func (w *statusWriter) Set(_ context.Context, claim types.NamespacedName, uid types.UID, devices []resourceapi.AllocatedDeviceStatus) {
	w.mu.Lock()
	w.desired[uid] = statusEntry{claim: claim, devices: devices}
	w.mu.Unlock()
	w.queue.Add(uid)
}

// Clear implements prepare.StatusWriter.
func (w *statusWriter) Clear(_ context.Context, claim types.NamespacedName, uid types.UID) {
	w.mu.Lock()
	w.desired[uid] = statusEntry{claim: claim}
	w.mu.Unlock()
	w.queue.Add(uid)
}

// Run processes updates with the given number of workers until ctx ends.
// When ctx ends the queue shuts down; Run returns once the workers have
// handled every item still queued.
func (w *statusWriter) Run(ctx context.Context, workers int) {
	go func() {
		<-ctx.Done()
		w.queue.ShutDown()
	}()
	workqueue.ParallelizeUntil(context.WithoutCancel(ctx), workers, workers, func(int) {
		for w.next(ctx) {
		}
	})
}

func (w *statusWriter) next(ctx context.Context) bool {
	uid, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(uid)
	w.mu.Lock()
	entry, ok := w.desired[uid]
	w.mu.Unlock()
	if !ok {
		w.queue.Forget(uid)
		return true
	}
	err := w.write(ctx, uid, entry)
	logger := klog.FromContext(ctx)
	switch {
	case err == nil, apierrors.IsNotFound(err):
		w.queue.Forget(uid)
		w.mu.Lock()
		// Only drop what was written; a newer desire stays queued.
		if cur, ok := w.desired[uid]; ok && sameEntry(cur, entry) {
			delete(w.desired, uid)
		}
		w.mu.Unlock()
	case w.queue.NumRequeues(uid) < maxStatusRetries:
		logger.V(2).Info("Writing claim status failed; retrying", "claim", entry.claim, "error", err.Error())
		w.queue.AddRateLimited(uid)
	default:
		logger.Info("Warning: giving up writing status.devices of claim; the claim is prepared, only its status lacks the devices (check RBAC on resourceclaims/status and resourceclaims/driver)",
			"claim", entry.claim, "error", err.Error())
		w.queue.Forget(uid)
	}
	return true
}

func sameEntry(a, b statusEntry) bool {
	if a.claim != b.claim || len(a.devices) != len(b.devices) || (a.devices == nil) != (b.devices == nil) {
		return false
	}
	for i := range a.devices {
		if a.devices[i].Device != b.devices[i].Device || string(a.devices[i].Data.Raw) != string(b.devices[i].Data.Raw) {
			return false
		}
	}
	return true
}

func (w *statusWriter) write(ctx context.Context, uid types.UID, e statusEntry) error {
	claims := w.client.ResourceV1().ResourceClaims(e.claim.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		claim, err := claims.Get(ctx, e.claim.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if claim.UID != uid {
			// The claim we prepared is gone; one of the same name is not ours.
			return apierrors.NewNotFound(resourceapi.Resource("resourceclaims"), e.claim.Name)
		}
		devices := mergeDeviceStatus(claim.Status.Devices, w.driver, e.devices)
		if apiequality.Semantic.DeepEqual(devices, claim.Status.Devices) {
			return nil
		}
		claim.Status.Devices = devices
		_, err = claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{FieldManager: statusFieldManager})
		return err
	})
}

// mergeDeviceStatus replaces driver's entries in current by ours and keeps
// every other driver's entries as they are.
func mergeDeviceStatus(current []resourceapi.AllocatedDeviceStatus, driver string, ours []resourceapi.AllocatedDeviceStatus) []resourceapi.AllocatedDeviceStatus {
	var out []resourceapi.AllocatedDeviceStatus
	for _, d := range current {
		if d.Driver != driver {
			out = append(out, d)
		}
	}
	return append(out, ours...)
}
