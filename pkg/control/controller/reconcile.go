package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/shadow"
	"github.com/tessera-dev/tessera/pkg/control/sliceintern"
	"github.com/tessera-dev/tessera/pkg/control/snapshot"
)

// Reconciler runs admission cycles and applies their decisions. Every event
// of interest maps to one key, so changes that arrive while a cycle runs
// are decided together in the next one.
type Reconciler struct {
	Client client.Client
	Reader client.Reader
	// Attributes reads the devices' attributes of Reader's slices (the
	// cache's compact form; nil: the slices carry them).
	Attributes *sliceintern.Interner
	Recorder   recorder.EventRecorder
	Engine     *decide.Engine
	Metrics    *Metrics
	Opts       Options
	// Shadow, when set, makes this a shadow controller (shadow.go): cycles
	// decide and compare; nothing is applied.
	Shadow *shadow.Tracker
	// Evictions, when set, makes reclaim's evictions (evict.go); nil:
	// through Client, with client-go's retries.
	Evictions *Evictions

	mu   sync.Mutex
	last time.Time
	// ungated and evicted remember what this process did until the cache
	// shows it, so that a lagging cache never makes a cycle admit into
	// devices an earlier cycle handed out, or evict twice.
	ungated map[types.UID]memo
	evicted map[types.UID]memo
	// refused are reclaim evictions the API refused lately (refusalTTL),
	// by pod UID: each cycle's snapshot carries them, so that reclaim
	// passes those victims over (decide.Snapshot.Refused).
	refused map[types.UID]decide.Refusal
	// slices and classes are the previous snapshot's, by UID (see reuse).
	slices  map[types.UID]*resourceapi.ResourceSlice
	classes map[types.UID]*resourceapi.DeviceClass
	// triggers are the relevant changes since the last cycle (first: the
	// one that came first); accounting says that a change may have moved
	// what the queues hold while nothing was gated; lastStatus is when
	// queue status was last computed (by a cycle or a status refresh).
	triggers   map[string]bool
	first      string
	accounting bool
	lastStatus time.Time
}

// reuse returns pointers to the items, and them by UID: the previous
// snapshot's pointer for an object whose UID and resourceVersion did not
// change (the same content), so that the engine keeps what it derived from
// it (decide.Engine keeps its catalog and device indexes while the
// slices and classes are the same objects); a list copies the cache's
// objects into a new array every time.
func reuse[T any, P interface {
	*T
	metav1.Object
}](prev map[types.UID]P, items []P) ([]P, map[types.UID]P) {
	out := make([]P, 0, len(items))
	next := make(map[types.UID]P, len(items))
	for _, o := range items {
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
	// grace is the grace period an eviction asked for (0: unknown).
	grace time.Duration
}

// memoTTL bounds how long a write may take to show in the cache.
const memoTTL = 2 * time.Minute

// refusalTTL is how long a refused reclaim eviction is remembered: the
// victim is passed over meanwhile, and tried again after it.
const refusalTTL = time.Minute

// CycleRequest is the one key of the admission controller.
var CycleRequest = reconcile.Request{NamespacedName: types.NamespacedName{Name: "admission-cycle"}}

// Reconcile runs one cycle when one can change anything: pods are gated
// (or a recorded decision is left to finish) and something relevant
// changed since the last cycle (a trigger: see Handler), or
// --resync-period passed. With nothing gated it runs no cycle: it only
// replaces stale pins and, when a queue's accounting may have changed,
// refreshes queue status (refreshStatus: no decision, no placement) at
// most once per --status-interval.
func (a *Reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
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
		if decide.HasAdmissionGate(&pods.Items[i]) && pods.Items[i].DeletionTimestamp == nil {
			gated = true
			break
		}
	}
	a.mu.Lock()
	triggers, first := a.triggers, a.first
	sinceLast, sinceStatus := time.Since(a.last), time.Since(a.lastStatus)
	trigger, refresh := "", false
	switch {
	case gated && len(triggers) > 0:
		trigger = first
	case gated && sinceLast >= a.Opts.ResyncPeriod:
		trigger = TriggerResync
	case !gated:
		if triggers[TriggerPod] || triggers[TriggerClaim] || triggers[TriggerQueue] || triggers[TriggerNamespace] || triggers[TriggerRetry] {
			a.accounting = true
		}
		// A shadow writes no status.
		refresh = a.accounting && a.Shadow == nil && sinceStatus >= a.Opts.StatusInterval
	}
	if trigger != "" || refresh {
		// Cleared before the snapshot is read, not after the status is
		// computed: a change that lands meanwhile sets it again and is
		// refreshed next time instead of being lost.
		a.accounting = false
	}
	a.triggers, a.first = nil, ""
	a.mu.Unlock()
	if trigger == "" {
		reason := SkipNoChange
		if !gated {
			reason = SkipNothingGated
		}
		a.Metrics.skipped(reason)
		if refresh {
			if err := a.refreshStatus(ctx); err != nil {
				a.Trigger(TriggerRetry)
				return reconcile.Result{}, err
			}
			sinceStatus = 0
		}
		a.mu.Lock()
		accounting := a.accounting && a.Shadow == nil
		a.mu.Unlock()
		// Come back for the resync (pods gated), the queue status
		// refresh or the next pin to pass its grace; else only an
		// event wakes this controller.
		next := time.Duration(0)
		if gated {
			next = a.Opts.ResyncPeriod - sinceLast
		}
		if accounting {
			if d := max(a.Opts.StatusInterval-sinceStatus, time.Millisecond); next <= 0 || d < next {
				next = d
			}
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
		// Reasons or queue status left to write: come back soon.
		a.Trigger(TriggerRetry)
		return reconcile.Result{RequeueAfter: max(a.Opts.CycleInterval, time.Second)}, nil
	}
	return reconcile.Result{RequeueAfter: a.Opts.ResyncPeriod}, nil
}

func (a *Reconciler) snapshot(ctx context.Context) (*decide.Snapshot, error) {
	// The cache's objects are never modified here: no copies. The engine
	// lists the DeviceTaintRules itself (Config.TaintRules).
	s, err := snapshot.Read(ctx, a.Reader, snapshot.Options{List: []client.ListOption{client.UnsafeDisableDeepCopy}, NoTaintRules: true, Attributes: a.Attributes})
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	for i, p := range s.Pods {
		s.Pods[i] = a.written(p, now)
		if r, ok := a.refused[p.UID]; ok {
			if s.Refused == nil {
				s.Refused = map[types.UID]decide.Refusal{}
			}
			s.Refused[p.UID] = r
		}
	}
	// Refusals of pods that are gone, or old, are forgotten.
	for uid, r := range a.refused {
		if _, live := s.Refused[uid]; !live || now.Sub(r.At) > refusalTTL {
			delete(a.refused, uid)
			delete(s.Refused, uid)
		}
	}
	s.Now = now
	// Unchanged slices and classes keep last cycle's pointers: the
	// engine's cache knows them by identity.
	s.Slices, a.slices = reuse(a.slices, s.Slices)
	s.Classes, a.classes = reuse(a.classes, s.Classes)
	return s, nil
}

// written is p as this controller last wrote it where the cache does not
// show that write yet (an ungating, an eviction); a.mu is held.
func (a *Reconciler) written(p *corev1.Pod, now time.Time) *corev1.Pod {
	if m, ok := a.ungated[p.UID]; ok {
		if !decide.HasAdmissionGate(p) || now.Sub(m.at) > memoTTL {
			delete(a.ungated, p.UID)
		} else {
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
			// Deleted with m.grace: its deadline, as the API server sets it.
			c := p.DeepCopy()
			t := metav1.NewTime(m.at.Add(m.grace))
			c.DeletionTimestamp = &t
			p = c
		}
	}
	return p
}

// decide runs the engine on snap and records the cycle (its time and
// trigger); a failed cycle is retried.
func (a *Reconciler) decide(ctx context.Context, snap *decide.Snapshot, trigger string) (*decide.Decision, error) {
	d, err := a.Engine.Decide(ctx, snap)
	if err != nil {
		a.Trigger(TriggerRetry)
		return nil, err
	}
	a.mu.Lock()
	a.last = time.Now()
	a.lastStatus = a.last
	a.mu.Unlock()
	a.Metrics.cycle(trigger)
	return d, nil
}

// refreshStatus recomputes and writes queue status without a decision
// cycle (decide.Engine.Status: what runs is charged, nothing is placed),
// for when nothing is gated but what the queues hold may have changed.
func (a *Reconciler) refreshStatus(ctx context.Context) error {
	snap, err := a.snapshot(ctx)
	if err != nil {
		return err
	}
	own(snap, a.Opts.ControllerName)
	st, err := a.Engine.Status(ctx, snap)
	if err != nil {
		return fmt.Errorf("queue status refresh: %w", err)
	}
	a.mu.Lock()
	a.lastStatus = time.Now()
	a.mu.Unlock()
	start := time.Now()
	if !a.updateQueues(ctx, snap, st.Queues) {
		a.mu.Lock()
		a.accounting = true // written again after --status-interval
		a.mu.Unlock()
	}
	klog.FromContext(ctx).V(2).Info("Queue status refresh", "queues", len(st.Queues), "compute", st.Duration, "write", time.Since(start))
	a.Metrics.statusRefresh(snap, st)
	return nil
}

// shadowCycle decides with the shadow's queues and compares; it applies
// nothing (see Shadow).
func (a *Reconciler) shadowCycle(ctx context.Context, snap *decide.Snapshot, trigger string) (reconcile.Result, error) {
	snap.Queues = a.Shadow.WithQueues(snap.Queues)
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
func (a *Reconciler) controllerName() string {
	if a.Opts.ControllerName == "" {
		return v1alpha1.DefaultControllerName
	}
	return a.Opts.ControllerName
}
