package controller

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// evictPod evicts p through the Eviction API (PodDisruptionBudgets are
// honoured: a refusal is an error the caller retries later), with a UID
// precondition so that a pod recreated under the same name is never hit.
// dryRun asks the API server whether it would evict, changing nothing.
// Reclaim, idle reclaim and stale pins all evict this way; the controller
// has no delete verb on pods.
func evictPod(ctx context.Context, c client.Client, p *corev1.Pod, dryRun bool) error {
	uid := p.UID
	opts := &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}, DeleteOptions: opts}
	target := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
	return c.SubResource("eviction").Create(ctx, target, ev)
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
