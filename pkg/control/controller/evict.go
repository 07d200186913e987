package controller

import (
	"context"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/pkg/control/decide"
)

// ReasonEvictionRefused is the event reason on a reclaim victim whose
// eviction the API refused.
const ReasonEvictionRefused = "EvictionRefused"

// evictPod evicts p through the Eviction API (PodDisruptionBudgets are
// honoured: a refusal is an error the caller handles), with a UID
// precondition so that a pod recreated under the same name is never hit.
// grace, when set, is the grace period the deletion asks for (the API
// server takes it over the pod's own; on a pod already terminating only a
// shorter one changes anything). dryRun asks the API server whether it
// would evict, changing nothing. Reclaim, idle reclaim and stale pins all
// evict this way.
func evictPod(ctx context.Context, c client.Client, p *corev1.Pod, grace *int64, dryRun bool) error {
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}, DeleteOptions: deleteOptions(p, grace)}
	if dryRun {
		ev.DeleteOptions.DryRun = []string{metav1.DryRunAll}
	}
	target := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
	return c.SubResource("eviction").Create(ctx, target, ev)
}

// Evictions evicts pods through the Eviction API without client-side
// retries. client-go sleeps on a 429's Retry-After and tries again, up to
// ten times; the Eviction API answers a budget whose status is being
// processed (which a tenant keeps so by updating its budget) with
// Retry-After: 10, which would hold a cycle's apply for minutes. Reclaim
// wants the refusal at once: it passes the victim over.
type Evictions struct {
	// REST is the core/v1 REST client (a clientset's CoreV1().RESTClient()).
	REST rest.Interface
}

func (e *Evictions) evict(ctx context.Context, p *corev1.Pod, grace *int64) error {
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}, DeleteOptions: deleteOptions(p, grace)}
	return e.REST.Post().Namespace(p.Namespace).Resource("pods").Name(p.Name).SubResource("eviction").
		MaxRetries(0).Body(ev).Do(ctx).Error()
}

// deletePod deletes p with the grace period, past any
// PodDisruptionBudget: only reclaim does, for an over-quota victim whose
// budget refused its eviction when nothing else makes room
// (decide.Eviction.Force). The chart grants delete on pods only for that,
// and its policy <controller>-pod-deletes allows it only on queued pods
// that carry the Reclaimed condition.
func deletePod(ctx context.Context, c client.Client, p *corev1.Pod, grace *int64) error {
	target := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
	o := deleteOptions(p, grace)
	return c.Delete(ctx, target, &client.DeleteOptions{Preconditions: o.Preconditions, GracePeriodSeconds: o.GracePeriodSeconds})
}

func deleteOptions(p *corev1.Pod, grace *int64) *metav1.DeleteOptions {
	uid := p.UID
	return &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}, GracePeriodSeconds: grace}
}

// budgetRefusal says whether err is a PodDisruptionBudget's refusal of an
// eviction: 429 with the DisruptionBudget cause, or the 500 the Eviction
// API answers for a pod that several budgets select (a tenant may create
// two to turn a 429 into an error).
func budgetRefusal(err error) bool {
	if apierrors.HasStatusCause(err, policyv1.DisruptionBudgetCause) {
		return true
	}
	return apierrors.IsInternalError(err) && strings.Contains(err.Error(), "PodDisruptionBudget")
}

// evictForReclaim evicts one pod of a reclaim (or over-limit) eviction
// with its bounded grace period. A budget's refusal of a forced eviction
// falls back to deleting the pod. What the API refuses is remembered
// (a.refused) for the next cycles, and the pod gets an event saying so;
// it returns true then.
func (a *Reconciler) evictForReclaim(ctx context.Context, p *corev1.Pod, ev *decide.Eviction) bool {
	logger := klog.FromContext(ctx)
	grace := decide.GraceSeconds(p, ev.GracePeriod)
	var err error
	if a.Evictions != nil {
		err = a.Evictions.evict(ctx, p, grace)
	} else {
		err = evictPod(ctx, a.Client, p, grace, false)
	}
	budget := err != nil && budgetRefusal(err)
	if budget && ev.Force {
		logger.Info("A disruption budget refused a reclaim eviction and no other over-quota work makes room: deleting the pod", "pod", klog.KObj(p), "gracePeriodSeconds", grace)
		err = deletePod(ctx, a.Client, p, grace)
		budget = false
	}
	switch {
	case err == nil:
		var g time.Duration
		if grace != nil {
			g = time.Duration(*grace) * time.Second
		}
		a.mu.Lock()
		delete(a.refused, p.UID)
		a.mu.Unlock()
		a.rememberEvicted(p.UID, g)
		return false
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return false // gone, or another pod under that name now
	}
	logger.Error(err, "Evicting a pod for reclaim was refused; reclaim passes it over for a while", "pod", klog.KObj(p), "budget", budget)
	a.mu.Lock()
	if a.refused == nil {
		a.refused = map[types.UID]decide.Refusal{}
	}
	a.refused[p.UID] = decide.Refusal{At: time.Now(), Budget: budget}
	a.mu.Unlock()
	msg := "eviction for reclaim refused: " + err.Error()
	a.Recorder.Eventf(p, nil, corev1.EventTypeWarning, ReasonEvictionRefused, "Evict", msg)
	return true
}

// findCondition is p's condition of type typ, nil when it has none.
func findCondition(p *corev1.Pod, typ corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}
