package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/queue"
)

// apply carries out a decision: admissions first (all members of a
// workload ungated back to back, workloads in decision order, so that the
// scheduler sees them in that order), then evictions, then the reasons on
// waiting pods and the queue status. It returns true when reasons or a
// queue's status are left for a later cycle.
func (a *Reconciler) apply(ctx context.Context, snap *decide.Snapshot, d *decide.Decision) bool {
	logger := klog.FromContext(ctx)
	nodes := map[string]bool{}
	for _, n := range snap.Nodes {
		nodes[n.Name] = true
	}
	now := metav1.Now()
	// Gates first, all workloads, so that nothing else delays the
	// scheduler; conditions and events after. A workload of several pods
	// records its decision on every member before any of its gates comes
	// off; then the gates of all admitted pods come off together, in
	// parallel (one workload at a time held 4,000 single-pod workloads to
	// about 20 ungates per second, docs/benchmarks.md#scale-end-to-end).
	type gate struct {
		ad  *decide.Admission
		p   *corev1.Pod
		pin bool
	}
	var gates []gate
	for _, ad := range d.Admit {
		pin := a.pins(ad.Workload.Gang)
		if len(ad.Pods) > 1 && !a.recordDecision(ctx, ad) {
			a.Engine.Forget(ad.Pods...)
			continue
		}
		for _, p := range ad.Pods {
			gates = append(gates, gate{ad, p, pin})
		}
		logger.V(3).Info("Admitted", "workload", ad.Workload.Key, "queue", ad.Workload.QueueName, "pods", len(ad.Pods), "charge", ad.Charge.String())
	}
	var failed []*corev1.Pod
	var mu sync.Mutex
	a.parallel(ctx, len(gates), func(i int) {
		g := gates[i]
		annotations, err := a.ungate(ctx, g.p, g.ad.Nodes[g.p.UID], chargeOf(g.ad, g.p), g.pin, nodes, now)
		if err != nil {
			logger.Error(err, "Ungating an admitted pod failed; it is decided again next cycle", "pod", klog.KObj(g.p), "workload", g.ad.Workload.Key)
			mu.Lock()
			failed = append(failed, g.p)
			mu.Unlock()
			return
		}
		a.remember(&a.ungated, g.p.UID, annotations)
	})
	a.Engine.Forget(failed...)
	type admitted struct {
		p   *corev1.Pod
		msg string
	}
	var done []admitted
	for _, ad := range d.Admit {
		for _, p := range ad.Pods {
			done = append(done, admitted{p, ad.Message})
		}
	}
	// The admission is in the ungating patch (admitted-at, admitted-by,
	// the charge and the node, annotations only the controller may set):
	// the condition is rewritten only where one says something else (the
	// pod waited, or was told why), and the events are one per queue and
	// cycle, so that an admitted pod costs the API server one write.
	a.parallel(ctx, len(done), func(i int) {
		if c := decide.AdmissionCondition(done[i].p); c != nil && (c.Status != corev1.ConditionTrue || c.Reason != decide.ReasonAdmitted) {
			a.setCondition(ctx, done[i].p, corev1.ConditionTrue, decide.ReasonAdmitted, done[i].msg, now)
		}
	})
	a.admittedEvents(snap.Queues, d.Admit, failed)
	refused := false
	for _, ev := range d.Evict {
		reason := ev.Reason
		if reason == "" {
			reason = decide.ReasonReclaimed
		}
		logger.Info("Evicting", "workload", ev.Workload.Key, "queue", ev.Workload.QueueName, "reason", reason, "force", ev.Force, "gracePeriod", ev.GracePeriod, "message", ev.Message)
		a.parallel(ctx, len(ev.Pods), func(i int) {
			p := ev.Pods[i]
			a.setCondition(ctx, p, corev1.ConditionFalse, reason, ev.Message, now)
			a.Recorder.Eventf(p, nil, corev1.EventTypeWarning, reason, "Evict", ev.Message)
			if a.evictForReclaim(ctx, p, ev) {
				mu.Lock()
				refused = true
				mu.Unlock()
			}
		})
	}
	type job struct {
		p *corev1.Pod
		v *decide.Verdict
	}
	var jobs []job
	for _, v := range d.Waiting {
		for _, p := range v.Workload.Pods {
			if !decide.HasAdmissionGate(p) {
				continue
			}
			if c := decide.AdmissionCondition(p); c != nil && c.Status == corev1.ConditionFalse && c.Reason == v.Reason && c.Message == v.Message {
				continue // already says so
			}
			jobs = append(jobs, job{p, v})
		}
	}
	more := false
	if limit := a.Opts.MaxReasonUpdates; limit > 0 && len(jobs) > limit {
		logger.V(3).Info("Explaining waiting pods over several cycles", "now", limit, "later", len(jobs)-limit)
		jobs, more = jobs[:limit], true
	}
	a.parallel(ctx, len(jobs), func(i int) {
		j := jobs[i]
		a.setCondition(ctx, j.p, corev1.ConditionFalse, j.v.Reason, j.v.Message, now)
		typ := corev1.EventTypeNormal
		if j.v.Invalid {
			typ = corev1.EventTypeWarning
		}
		a.Recorder.Eventf(j.p, nil, typ, j.v.Reason, "Queue", j.v.Message)
	})
	if !a.updateQueues(ctx, snap, d.Queues) {
		more = true
	}
	// A refused eviction is decided again soon: reclaim passes the
	// victim over, and holds nothing if no other makes room.
	return more || refused
}

// recordDecision is the first phase of admitting a workload of several
// pods: every member gets the decision annotation ("<id>/<members>") and
// its simulated node while it is still gated. Only when all members carry
// it does any gate come off, so that a controller that dies or fails
// between the members' patches leaves either a decision every member
// records (finishDecisions completes it) or one some lack (rolled back:
// no member has started). A failed patch rolls back here at once.
func (a *Reconciler) recordDecision(ctx context.Context, ad *decide.Admission) bool {
	logger := klog.FromContext(ctx)
	id := fmt.Sprintf("%s/%d", rand.String(10), len(ad.Pods))
	recorded := make([]bool, len(ad.Pods))
	ok := true
	var mu sync.Mutex
	a.parallel(ctx, len(ad.Pods), func(i int) {
		p := ad.Pods[i]
		annotations := map[string]any{v1alpha1.DecisionAnnotation: id}
		if c := chargeOf(ad, p); c != "" {
			annotations[v1alpha1.AdmittedChargeAnnotation] = c
		}
		if n := ad.Nodes[p.UID]; n != "" {
			annotations[v1alpha1.NodeAnnotation] = n
		}
		err := a.patchAnnotations(ctx, p, annotations)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			logger.Error(err, "Recording an admission decision failed; the workload is decided again next cycle", "pod", klog.KObj(p), "workload", ad.Workload.Key)
			ok = false
			return
		}
		recorded[i] = true
	})
	if ok {
		return true
	}
	for i, p := range ad.Pods {
		if recorded[i] {
			a.rollback(ctx, p)
		}
	}
	return false
}

// finishDecisions completes or rolls back the decisions an earlier cycle
// (of this or a previous controller) recorded but did not carry out:
//   - when every member recorded the decision, or a member was already
//     ungated, the gated members are ungated now: a gang never runs
//     partly without the reservation the decision made for all of it;
//   - otherwise no member has started: the annotation is removed and the
//     workload is decided again.
//
// It returns whether it changed anything.
func (a *Reconciler) finishDecisions(ctx context.Context, snap *decide.Snapshot) bool {
	logger := klog.FromContext(ctx)
	type decision struct {
		members        int
		gated, started []*corev1.Pod
	}
	decisions := map[string]*decision{}
	for _, p := range snap.Pods {
		id := p.Annotations[v1alpha1.DecisionAnnotation]
		if id == "" || p.DeletionTimestamp != nil {
			continue
		}
		d := decisions[id]
		if d == nil {
			d = &decision{}
			_, n, _ := strings.Cut(id, "/")
			d.members, _ = strconv.Atoi(n)
			decisions[id] = d
		}
		if decide.HasAdmissionGate(p) {
			d.gated = append(d.gated, p)
		} else {
			d.started = append(d.started, p)
		}
	}
	nodes := map[string]bool{}
	for _, n := range snap.Nodes {
		nodes[n.Name] = true
	}
	changed := false
	now := metav1.Now()
	for id, d := range decisions {
		if len(d.gated) == 0 {
			continue
		}
		changed = true
		if len(d.started) > 0 || len(d.gated)+len(d.started) >= d.members {
			logger.Info("Completing an admission a controller recorded but did not carry out", "decision", id, "gated", len(d.gated), "started", len(d.started))
			a.parallel(ctx, len(d.gated), func(i int) {
				p := d.gated[i]
				pin := a.pins(p.Labels[v1alpha1.GangLabel] != "")
				// The decision recorded the admitted charge already.
				annotations, err := a.ungate(ctx, p, p.Annotations[v1alpha1.NodeAnnotation], "", pin, nodes, now)
				if err != nil {
					logger.Error(err, "Completing the admission of a pod failed; retrying next cycle", "pod", klog.KObj(p), "decision", id)
					return
				}
				a.remember(&a.ungated, p.UID, annotations)
			})
			continue
		}
		logger.Info("Rolling back an admission decision that not every member recorded", "decision", id, "recorded", len(d.gated), "members", d.members)
		a.parallel(ctx, len(d.gated), func(i int) { a.rollback(ctx, d.gated[i]) })
	}
	return changed
}

// rollback removes a gated pod's decision annotation.
func (a *Reconciler) rollback(ctx context.Context, p *corev1.Pod) {
	if err := a.patchAnnotations(ctx, p, map[string]any{v1alpha1.DecisionAnnotation: nil}); err != nil && !apierrors.IsNotFound(err) {
		klog.FromContext(ctx).Error(err, "Rolling back an admission decision failed; retrying next cycle", "pod", klog.KObj(p))
	}
}

// patchAnnotations sets (nil: removes) annotations of the pod it was
// decided on (the UID precondition refuses a pod recreated under its name).
func (a *Reconciler) patchAnnotations(ctx context.Context, p *corev1.Pod, annotations map[string]any) error {
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": string(p.UID), "annotations": annotations}})
	if err != nil {
		return err
	}
	target := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
	return a.Client.Patch(ctx, target, client.RawPatch(types.MergePatchType, data))
}

func (a *Reconciler) parallel(ctx context.Context, n int, f func(i int)) {
	workqueue.ParallelizeUntil(ctx, a.Opts.ApplyWorkers, n, f)
}

// pins says whether an admitted pod is pinned (--pin-nodes).
func (a *Reconciler) pins(gang bool) bool {
	return a.Opts.PinNodes == PinAll || (a.Opts.PinNodes == PinGangs && gang)
}

// rememberEvicted remembers an eviction (with the grace period it asked
// for) until the cache shows the pod deleting.
func (a *Reconciler) rememberEvicted(uid types.UID, grace time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.evicted == nil {
		a.evicted = map[types.UID]memo{}
	}
	a.evicted[uid] = memo{at: time.Now(), grace: grace}
}

func (a *Reconciler) remember(m *map[types.UID]memo, uid types.UID, annotations map[string]string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if *m == nil {
		*m = map[types.UID]memo{}
	}
	(*m)[uid] = memo{at: time.Now(), annotations: annotations}
}

// ungate removes the admission gate (and only it), records the simulated
// node and, when pinning, narrows the pod's required node affinity to that
// node in the same patch (see pinTerms) if the node exists.
func (a *Reconciler) ungate(ctx context.Context, p *corev1.Pod, node, charge string, pin bool, nodes map[string]bool, now metav1.Time) (map[string]string, error) {
	// metadata.uid makes the patch fail on a pod recreated under the same
	// name since the snapshot (the UID is immutable).
	annotations := map[string]string{v1alpha1.AdmittedAtAnnotation: now.UTC().Format(time.RFC3339), v1alpha1.AdmittedByAnnotation: a.controllerName()}
	if charge != "" {
		// With the gate's removal, in the same patch: what the pod was
		// admitted with, against which what it holds is checked.
		annotations[v1alpha1.AdmittedChargeAnnotation] = charge
	}
	md := map[string]any{"uid": string(p.UID), "annotations": annotations}
	patch := map[string]any{
		"metadata": md,
		"spec": map[string]any{
			"schedulingGates": []map[string]any{{"$patch": "delete", "name": v1alpha1.AdmissionGate}},
		},
	}
	if node != "" {
		annotations[v1alpha1.NodeAnnotation] = node
		if pin && nodes[node] {
			if terms, ok := pinTerms(p, node); ok {
				patch["spec"].(map[string]any)["affinity"] = pinPatch(terms)
				annotations[PinnedAnnotation] = node
			}
		}
	}
	data, err := json.Marshal(patch)
	if err != nil {
		return nil, err
	}
	target := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
	return annotations, a.Client.Patch(ctx, target, client.RawPatch(types.StrategicMergePatchType, data))
}

// chargeOf is the value of v1alpha1.AdmittedChargeAnnotation for an
// admitted pod.
func chargeOf(ad *decide.Admission, p *corev1.Pod) string {
	v, ok := ad.Holds[p.UID]
	if !ok {
		return ""
	}
	return decide.FormatCharge(v)
}

// setCondition writes the admission condition with a strategic merge patch
// (other writers' conditions are kept).
func (a *Reconciler) setCondition(ctx context.Context, p *corev1.Pod, status corev1.ConditionStatus, reason, message string, now metav1.Time) {
	a.setConditions(ctx, p, now, corev1.PodCondition{Type: v1alpha1.AdmissionCondition, Status: status, Reason: reason, Message: message})
}

// setConditions writes pod conditions (their times set here).
func (a *Reconciler) setConditions(ctx context.Context, p *corev1.Pod, now metav1.Time, conds ...corev1.PodCondition) {
	for i := range conds {
		cond := &conds[i]
		cond.LastTransitionTime, cond.LastProbeTime = now, now
		for _, c := range p.Status.Conditions {
			if c.Type == cond.Type && c.Status == cond.Status {
				cond.LastTransitionTime = c.LastTransitionTime
			}
		}
	}
	patch := map[string]any{"status": map[string]any{"conditions": conds}}
	data, err := json.Marshal(patch)
	if err != nil {
		return
	}
	target := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
	if err := a.Client.Status().Patch(ctx, target, client.RawPatch(types.StrategicMergePatchType, data)); err != nil && !apierrors.IsNotFound(err) {
		klog.FromContext(ctx).V(2).Info("Setting the admission condition failed", "pod", klog.KObj(p), "err", err)
	}
}

// updateQueues writes the status of every queue that changed (statuses:
// a cycle's or a status refresh's, by name).
//
// It returns false when a write failed (a conflict with the history
// keeper's own status write included): the caller writes again later, since
// with nothing gated no cycle comes by to do it.
func (a *Reconciler) updateQueues(ctx context.Context, snap *decide.Snapshot, statuses map[string]*v1alpha1.QueueStatus) bool {
	ok := true
	problems := decide.QueueProblems(snap.Queues)
	owners := queue.Owners(snap.Queues)
	queues := append([]*v1alpha1.Queue(nil), snap.Queues...)
	sort.Slice(queues, func(i, j int) bool { return queues[i].Name < queues[j].Name })
	for _, q := range queues {
		st := statuses[q.Name]
		if st == nil {
			continue
		}
		next := st.DeepCopy()
		next.ObservedGeneration = q.Generation
		next.Usage = q.Status.Usage // the history keeper's (history.go)
		next.Conditions = append([]metav1.Condition(nil), q.Status.Conditions...)
		cond := metav1.Condition{Type: v1alpha1.QueueConditionValid, Status: metav1.ConditionTrue, Reason: "Valid", Message: "queue takes workloads", ObservedGeneration: q.Generation}
		if why := problems[q.Name]; why != "" {
			cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Invalid", why
		} else if len(childrenOf(q.Name, snap.Queues)) > 0 {
			cond.Message = "parent queue: workloads go to its leaf queues"
		}
		meta.SetStatusCondition(&next.Conditions, cond)
		meta.SetStatusCondition(&next.Conditions, assignedCondition(owners[q.Name], q.Generation))
		if statusEqual(&q.Status, next) {
			continue
		}
		target := q.DeepCopy()
		target.Status = *next
		if err := a.Client.Status().Update(ctx, target); err != nil && !apierrors.IsNotFound(err) {
			ok = false
			if !apierrors.IsConflict(err) {
				klog.FromContext(ctx).Error(err, "Updating queue status failed; written again later", "queue", q.Name)
			}
		}
	}
	return ok
}

func childrenOf(name string, qs []*v1alpha1.Queue) []string { return queue.Children(name, qs) }

// statusEqual compares statuses, quantities by value.
func statusEqual(a, b *v1alpha1.QueueStatus) bool {
	if a.ObservedGeneration != b.ObservedGeneration || a.AdmittedWorkloads != b.AdmittedWorkloads || a.PendingWorkloads != b.PendingWorkloads {
		return false
	}
	for _, pair := range [][2]v1alpha1.ResourceList{{a.Allocated, b.Allocated}, {a.Used, b.Used}, {a.Pending, b.Pending}, {a.FairShare, b.FairShare}} {
		if len(pair[0]) != len(pair[1]) {
			return false
		}
		for k, v := range pair[0] {
			w, ok := pair[1][k]
			if !ok || v.Cmp(w) != 0 {
				return false
			}
		}
	}
	return apiequality.Semantic.DeepEqual(a.Conditions, b.Conditions)
}

// maxNamedInEvent bounds the workloads an Admitted event names.
const maxNamedInEvent = 10

// admittedEvents records one Admitted event per queue for a cycle's
// admissions (on the Queue: `kubectl describe queue`), naming its first
// workloads; failed are the pods whose ungating failed (decided again).
// Each pod's own record is its annotations (admitted-at, admitted-by,
// charge, node), the controller's log (V(3) "Admitted") and metrics.
func (a *Reconciler) admittedEvents(queues []*v1alpha1.Queue, admits []*decide.Admission, failed []*corev1.Pod) {
	skip := map[types.UID]bool{}
	for _, p := range failed {
		skip[p.UID] = true
	}
	type tally struct {
		pods      int
		workloads []string
	}
	byQueue := map[string]*tally{}
	for _, ad := range admits {
		n := 0
		for _, p := range ad.Pods {
			if !skip[p.UID] {
				n++
			}
		}
		if n == 0 {
			continue
		}
		t := byQueue[ad.Workload.QueueName]
		if t == nil {
			t = &tally{}
			byQueue[ad.Workload.QueueName] = t
		}
		t.pods += n
		t.workloads = append(t.workloads, ad.Workload.Key)
	}
	for _, q := range queues {
		t := byQueue[q.Name]
		if t == nil {
			continue
		}
		named := t.workloads
		more := ""
		if len(named) > maxNamedInEvent {
			more = fmt.Sprintf(" and %d more", len(named)-maxNamedInEvent)
			named = named[:maxNamedInEvent]
		}
		a.Recorder.Eventf(q, nil, corev1.EventTypeNormal, decide.ReasonAdmitted, "Admit",
			"admitted %d pods of %d workloads: %s%s", t.pods, len(t.workloads), strings.Join(named, ", "), more)
	}
}
