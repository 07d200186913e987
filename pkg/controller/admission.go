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
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/admission"
	"github.com/tessera-dev/tessera/pkg/queue"
)

// Admitter runs admission cycles and applies their decisions. Every event
// of interest maps to one key, so changes that arrive while a cycle runs
// are decided together in the next one.
type Admitter struct {
	Client   client.Client
	Reader   client.Reader
	Recorder recorder.EventRecorder
	Engine   *admission.Engine
	Metrics  *Metrics
	Opts     Options
	// Shadow, when set, makes this a shadow controller (shadow.go): cycles
	// decide and compare; nothing is applied.
	Shadow *Shadow

	mu   sync.Mutex
	last time.Time
	// ungated and evicted remember what this process did until the cache
	// shows it, so that a lagging cache never makes a cycle admit into
	// devices an earlier cycle handed out, or evict twice.
	ungated map[types.UID]memo
	evicted map[types.UID]memo
	// slices and classes are the previous snapshot's, by UID (see reuse).
	slices  map[types.UID]*resourceapi.ResourceSlice
	classes map[types.UID]*resourceapi.DeviceClass
	// triggers are the relevant changes since the last cycle (first: the
	// one that came first); accounting says that a change may have moved
	// what the queues hold while nothing was gated.
	triggers   map[string]bool
	first      string
	accounting bool
}

// reuse returns pointers to the items, and them by UID: the previous
// snapshot's pointer for an object whose UID and resourceVersion did not
// change (the same content), so that the engine keeps what it derived from
// it (admission.Engine keeps its catalog and device indexes while the
// slices and classes are the same objects); a list copies the cache's
// objects into a new array every time.
func reuse[T any, P interface {
	*T
	metav1.Object
}](prev map[types.UID]P, items []T) ([]P, map[types.UID]P) {
	out := make([]P, 0, len(items))
	next := make(map[types.UID]P, len(items))
	for i := range items {
		o := P(&items[i])
		if p, ok := prev[o.GetUID()]; ok && o.GetResourceVersion() != "" && p.GetResourceVersion() == o.GetResourceVersion() {
			o = p
		}
		out = append(out, o)
		next[o.GetUID()] = o
	}
	return out, next
}

type memo struct {
	at          time.Time
	annotations map[string]string
}

// memoTTL bounds how long a write may take to show in the cache.
const memoTTL = 2 * time.Minute

// CycleRequest is the one key of the admission controller.
var CycleRequest = reconcile.Request{NamespacedName: types.NamespacedName{Name: "admission-cycle"}}

// Reconcile runs one cycle when one can change anything: pods are gated
// (or a recorded decision is left to finish) and something relevant
// changed since the last cycle (a trigger: see Handler), or
// --resync-period passed. With nothing gated it decides nothing: it only
// replaces stale pins and, when a queue's accounting may have changed,
// refreshes queue status at most once per --resync-period.
func (a *Admitter) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	a.mu.Lock()
	wait := a.Opts.CycleInterval - time.Since(a.last)
	a.mu.Unlock()
	if wait > 0 {
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	logger := klog.FromContext(ctx)
	var pods corev1.PodList
	if err := a.Reader.List(ctx, &pods, client.UnsafeDisableDeepCopy, client.HasLabels{v1alpha1.QueueLabel}); err != nil {
		a.Trigger(TriggerRetry)
		return reconcile.Result{}, fmt.Errorf("listing pods: %w", err)
	}
	// Only this controller's queues' pods (canary queues: owner.go).
	var queues v1alpha1.QueueList
	if err := a.Reader.List(ctx, &queues, client.UnsafeDisableDeepCopy); err != nil {
		a.Trigger(TriggerRetry)
		return reconcile.Result{}, fmt.Errorf("listing queues: %w", err)
	}
	owner := newOwnership(a.Opts.ControllerName, ptrs(queues.Items))
	for i := range pods.Items {
		if !owner.pod(&pods.Items[i]) { // copy only with another controller's pods
			mine := make([]corev1.Pod, 0, len(pods.Items))
			for j := range pods.Items {
				if owner.pod(&pods.Items[j]) {
					mine = append(mine, pods.Items[j])
				}
			}
			pods.Items = mine
			break
		}
	}
	var (
		staleNext time.Time
		err       error
	)
	if a.Shadow == nil { // a shadow replaces no pods
		if staleNext, err = a.recoverStalePins(ctx, &pods); err != nil {
			a.Trigger(TriggerRetry)
			return reconcile.Result{}, err
		}
	}
	gated := false
	for i := range pods.Items {
		if admission.HasAdmissionGate(&pods.Items[i]) && pods.Items[i].DeletionTimestamp == nil {
			gated = true
			break
		}
	}
	a.mu.Lock()
	triggers, first := a.triggers, a.first
	sinceLast := time.Since(a.last)
	trigger := ""
	switch {
	case gated && len(triggers) > 0:
		trigger = first
	case gated && sinceLast >= a.Opts.ResyncPeriod:
		trigger = TriggerResync
	case !gated:
		if triggers[TriggerPod] || triggers[TriggerClaim] || triggers[TriggerQueue] || triggers[TriggerNamespace] || triggers[TriggerRetry] {
			a.accounting = true
		}
		if a.accounting && sinceLast >= a.Opts.ResyncPeriod {
			trigger = TriggerAccounting
		}
	}
	a.triggers, a.first = nil, ""
	accounting := a.accounting
	a.mu.Unlock()
	if trigger == "" {
		reason := SkipNoChange
		if !gated {
			reason = SkipNothingGated
		}
		a.Metrics.skipped(reason)
		// Come back for the resync (pods gated), the queue status
		// refresh or the next pin to pass its grace; else only an
		// event wakes this controller.
		next := time.Duration(0)
		if gated || accounting {
			next = a.Opts.ResyncPeriod - sinceLast
		}
		if !staleNext.IsZero() {
			if d := time.Until(staleNext); next == 0 || d < next {
				next = d
			}
		}
		if next > 0 {
			next = max(next, time.Second)
		}
		return reconcile.Result{RequeueAfter: next}, nil
	}
	snap, err := a.snapshot(ctx)
	if err != nil {
		a.Trigger(TriggerRetry)
		return reconcile.Result{}, err
	}
	if a.Shadow != nil {
		return a.shadowCycle(ctx, snap, trigger)
	}
	own(snap, a.Opts.ControllerName)
	if a.finishDecisions(ctx, snap) {
		// Decide on what the completions and rollbacks left.
		if snap, err = a.snapshot(ctx); err != nil {
			a.Trigger(TriggerRetry)
			return reconcile.Result{}, err
		}
		own(snap, a.Opts.ControllerName)
	}
	d, err := a.decide(ctx, snap, trigger)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("admission cycle: %w", err)
	}
	start := time.Now()
	more := a.apply(ctx, snap, d)
	logger.V(2).Info("Admission cycle", "trigger", trigger, "workloads", d.Stats.Workloads, "pending", d.Stats.Pending, "admitted", d.Stats.Admitted,
		"waiting", d.Stats.Waiting, "invalid", d.Stats.Invalid, "evicted", d.Stats.Evicted, "decide", d.Stats.Duration, "apply", time.Since(start))
	a.Metrics.observe(snap, d, time.Since(start))
	if more {
		// Reasons left to write: come back soon.
		a.Trigger(TriggerRetry)
		return reconcile.Result{RequeueAfter: max(a.Opts.CycleInterval, time.Second)}, nil
	}
	return reconcile.Result{RequeueAfter: a.Opts.ResyncPeriod}, nil
}

func (a *Admitter) snapshot(ctx context.Context) (*admission.Snapshot, error) {
	fast := client.UnsafeDisableDeepCopy
	var (
		queues    v1alpha1.QueueList
		pods      corev1.PodList
		claims    resourceapi.ResourceClaimList
		templates resourceapi.ResourceClaimTemplateList
		slices    resourceapi.ResourceSliceList
		classes   resourceapi.DeviceClassList
		nodes     corev1.NodeList
	)
	for _, l := range []client.ObjectList{&queues, &claims, &templates, &slices, &classes, &nodes} {
		if err := a.Reader.List(ctx, l, fast); err != nil {
			return nil, fmt.Errorf("listing %T: %w", l, err)
		}
	}
	if err := a.Reader.List(ctx, &pods, fast, client.HasLabels{v1alpha1.QueueLabel}); err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	s := &admission.Snapshot{}
	for i := range queues.Items {
		s.Queues = append(s.Queues, &queues.Items[i])
	}
	a.mu.Lock()
	now := time.Now()
	for i := range pods.Items {
		p := &pods.Items[i]
		if m, ok := a.ungated[p.UID]; ok {
			if !admission.HasAdmissionGate(p) || now.Sub(m.at) > memoTTL {
				delete(a.ungated, p.UID)
			} else {
				// Not in the cache yet: decide on what was written.
				c := p.DeepCopy()
				c.Spec.SchedulingGates = nil
				for _, g := range p.Spec.SchedulingGates {
					if g.Name != v1alpha1.AdmissionGate {
						c.Spec.SchedulingGates = append(c.Spec.SchedulingGates, g)
					}
				}
				if c.Annotations == nil {
					c.Annotations = map[string]string{}
				}
				for k, v := range m.annotations {
					c.Annotations[k] = v
				}
				p = c
			}
		}
		if m, ok := a.evicted[p.UID]; ok {
			if p.DeletionTimestamp != nil || now.Sub(m.at) > memoTTL {
				delete(a.evicted, p.UID)
			} else {
				c := p.DeepCopy()
				t := metav1.NewTime(m.at)
				c.DeletionTimestamp = &t
				p = c
			}
		}
		s.Pods = append(s.Pods, p)
	}
	a.mu.Unlock()
	for i := range claims.Items {
		s.Claims = append(s.Claims, &claims.Items[i])
	}
	for i := range templates.Items {
		s.Templates = append(s.Templates, &templates.Items[i])
	}
	a.mu.Lock()
	s.Slices, a.slices = reuse(a.slices, slices.Items)
	s.Classes, a.classes = reuse(a.classes, classes.Items)
	a.mu.Unlock()
	for i := range nodes.Items {
		s.Nodes = append(s.Nodes, &nodes.Items[i])
	}
	// Managed namespaces: the claims their unqueued pods hold (pods that ran
	// before the label) are charged to the namespace's queue.
	var namespaces corev1.NamespaceList
	if err := a.Reader.List(ctx, &namespaces, fast, client.HasLabels{v1alpha1.QueueLabel}); err != nil {
		return nil, fmt.Errorf("listing namespaces: %w", err)
	}
	for i := range namespaces.Items {
		s.Namespaces = append(s.Namespaces, &namespaces.Items[i])
	}
	return s, nil
}

// apply carries out a decision: admissions first (all members of a
// workload ungated back to back, workloads in decision order, so that the
// scheduler sees them in that order), then evictions, then the reasons on
// waiting pods and the queue status. It returns true when reasons are left
// for a later cycle.
func (a *Admitter) apply(ctx context.Context, snap *admission.Snapshot, d *admission.Decision) bool {
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
		ad  *admission.Admission
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
	a.parallel(len(gates), func(i int) {
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
	a.parallel(len(done), func(i int) {
		a.setCondition(ctx, done[i].p, corev1.ConditionTrue, admission.ReasonAdmitted, done[i].msg, now)
		a.Recorder.Eventf(done[i].p, nil, corev1.EventTypeNormal, admission.ReasonAdmitted, "Admit", done[i].msg)
	})
	for _, ev := range d.Evict {
		reason := ev.Reason
		if reason == "" {
			reason = admission.ReasonReclaimed
		}
		logger.Info("Evicting", "workload", ev.Workload.Key, "queue", ev.Workload.QueueName, "reason", reason, "message", ev.Message)
		a.parallel(len(ev.Pods), func(i int) {
			p := ev.Pods[i]
			a.setCondition(ctx, p, corev1.ConditionFalse, reason, ev.Message, now)
			a.Recorder.Eventf(p, nil, corev1.EventTypeWarning, reason, "Evict", ev.Message)
			// The Eviction API: PodDisruptionBudgets are honoured; a refused
			// eviction is tried again by a later cycle's reclaim.
			if err := evictPod(ctx, a.Client, p, false); err != nil {
				if !apierrors.IsNotFound(err) {
					logger.Error(err, "Evicting a pod failed", "pod", klog.KObj(p))
				}
				return
			}
			a.remember(&a.evicted, p.UID, nil)
		})
	}
	type job struct {
		p *corev1.Pod
		v *admission.Verdict
	}
	var jobs []job
	for _, v := range d.Waiting {
		for _, p := range v.Workload.Pods {
			if !admission.HasAdmissionGate(p) {
				continue
			}
			if c := podCondition(p); c != nil && c.Status == corev1.ConditionFalse && c.Reason == v.Reason && c.Message == v.Message {
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
	a.parallel(len(jobs), func(i int) {
		j := jobs[i]
		a.setCondition(ctx, j.p, corev1.ConditionFalse, j.v.Reason, j.v.Message, now)
		typ := corev1.EventTypeNormal
		if j.v.Invalid {
			typ = corev1.EventTypeWarning
		}
		a.Recorder.Eventf(j.p, nil, typ, j.v.Reason, "Queue", j.v.Message)
	})
	a.updateQueues(ctx, snap, d)
	return more
}

// recordDecision is the first phase of admitting a workload of several
// pods: every member gets the decision annotation ("<id>/<members>") and
// its simulated node while it is still gated. Only when all members carry
// it does any gate come off, so that a controller that dies or fails
// between the members' patches leaves either a decision every member
// records (finishDecisions completes it) or one some lack (rolled back:
// no member has started). A failed patch rolls back here at once.
func (a *Admitter) recordDecision(ctx context.Context, ad *admission.Admission) bool {
	logger := klog.FromContext(ctx)
	id := fmt.Sprintf("%s/%d", rand.String(10), len(ad.Pods))
	recorded := make([]bool, len(ad.Pods))
	ok := true
	var mu sync.Mutex
	a.parallel(len(ad.Pods), func(i int) {
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
func (a *Admitter) finishDecisions(ctx context.Context, snap *admission.Snapshot) bool {
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
		if admission.HasAdmissionGate(p) {
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
			a.parallel(len(d.gated), func(i int) {
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
		a.parallel(len(d.gated), func(i int) { a.rollback(ctx, d.gated[i]) })
	}
	return changed
}

// rollback removes a gated pod's decision annotation.
func (a *Admitter) rollback(ctx context.Context, p *corev1.Pod) {
	if err := a.patchAnnotations(ctx, p, map[string]any{v1alpha1.DecisionAnnotation: nil}); err != nil && !apierrors.IsNotFound(err) {
		klog.FromContext(ctx).Error(err, "Rolling back an admission decision failed; retrying next cycle", "pod", klog.KObj(p))
	}
}

// patchAnnotations sets (nil: removes) annotations of the pod it was
// decided on (the UID precondition refuses a pod recreated under its name).
func (a *Admitter) patchAnnotations(ctx context.Context, p *corev1.Pod, annotations map[string]any) error {
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": string(p.UID), "annotations": annotations}})
	if err != nil {
		return err
	}
	target := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
	return a.Client.Patch(ctx, target, client.RawPatch(types.MergePatchType, data))
}

func (a *Admitter) parallel(n int, f func(i int)) {
	if n == 0 {
		return
	}
	workers := min(a.Opts.ApplyWorkers, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// pins says whether an admitted pod is pinned (--pin-nodes).
func (a *Admitter) pins(gang bool) bool {
	return a.Opts.PinNodes == PinAll || (a.Opts.PinNodes == PinGangs && gang)
}

func (a *Admitter) remember(m *map[types.UID]memo, uid types.UID, annotations map[string]string) {
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
func (a *Admitter) ungate(ctx context.Context, p *corev1.Pod, node, charge string, pin bool, nodes map[string]bool, now metav1.Time) (map[string]string, error) {
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
func chargeOf(ad *admission.Admission, p *corev1.Pod) string {
	v, ok := ad.Holds[p.UID]
	if !ok {
		return ""
	}
	return admission.FormatCharge(v)
}

func podCondition(p *corev1.Pod) *corev1.PodCondition {
	return findCondition(p, v1alpha1.AdmissionCondition)
}

// setCondition writes the admission condition with a strategic merge patch
// (other writers' conditions are kept).
func (a *Admitter) setCondition(ctx context.Context, p *corev1.Pod, status corev1.ConditionStatus, reason, message string, now metav1.Time) {
	a.setConditions(ctx, p, now, corev1.PodCondition{Type: v1alpha1.AdmissionCondition, Status: status, Reason: reason, Message: message})
}

// setConditions writes pod conditions (their times set here).
func (a *Admitter) setConditions(ctx context.Context, p *corev1.Pod, now metav1.Time, conds ...corev1.PodCondition) {
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

// updateQueues writes the status of every queue that changed.
func (a *Admitter) updateQueues(ctx context.Context, snap *admission.Snapshot, d *admission.Decision) {
	problems := admission.QueueProblems(snap.Queues)
	owners := queue.Owners(snap.Queues)
	queues := append([]*v1alpha1.Queue(nil), snap.Queues...)
	sort.Slice(queues, func(i, j int) bool { return queues[i].Name < queues[j].Name })
	for _, q := range queues {
		st := d.Queues[q.Name]
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
		if err := a.Client.Status().Update(ctx, target); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			klog.FromContext(ctx).Error(err, "Updating queue status failed", "queue", q.Name)
		}
	}
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

// decide runs the engine on snap and records the cycle (its time and
// trigger); a failed cycle is retried.
func (a *Admitter) decide(ctx context.Context, snap *admission.Snapshot, trigger string) (*admission.Decision, error) {
	d, err := a.Engine.Decide(ctx, snap)
	if err != nil {
		a.Trigger(TriggerRetry)
		return nil, err
	}
	a.mu.Lock()
	a.last = time.Now()
	a.accounting = false
	a.mu.Unlock()
	a.Metrics.cycle(trigger)
	return d, nil
}

// shadowCycle decides with the shadow's queues and compares; it applies
// nothing (see Shadow).
func (a *Admitter) shadowCycle(ctx context.Context, snap *admission.Snapshot, trigger string) (reconcile.Result, error) {
	snap.Queues = a.Shadow.queues(snap.Queues)
	own(snap, a.Opts.ControllerName)
	d, err := a.decide(ctx, snap, trigger)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("shadow admission cycle: %w", err)
	}
	diffs := a.Shadow.Cycle(ctx, a.Engine, snap, d)
	klog.FromContext(ctx).V(2).Info("Shadow admission cycle", "trigger", trigger, "workloads", d.Stats.Workloads, "wouldAdmit", d.Stats.Admitted,
		"waiting", d.Stats.Waiting, "wouldEvict", d.Stats.Evicted, "differences", len(diffs), "decide", d.Stats.Duration)
	return reconcile.Result{RequeueAfter: a.Opts.ResyncPeriod}, nil
}

// controllerName is this controller's --controller-name.
func (a *Admitter) controllerName() string {
	if a.Opts.ControllerName == "" {
		return v1alpha1.DefaultControllerName
	}
	return a.Opts.ControllerName
}
