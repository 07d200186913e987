package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/idle"
	"github.com/tessera-dev/tessera/pkg/control/podclaims"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

// Reasons of the idle condition and events.
const (
	ReasonIdle            = "Idle"
	ReasonIdleActive      = "Active"
	ReasonIdleEvicted     = "IdleEvicted"
	ReasonIdleEvictWaits  = "IdleEvictionBlocked"
	defaultIdleInterval   = 15 * time.Second
	idleEvictionResultOK  = "evicted"
	idleEvictionResultPDB = "refused"
)

// IdleReclaimer applies the queues' spec.idle (package idle): every
// Interval it judges the running, admitted pods of the queues that set it,
// marks idle ones (condition tessera.dev/Idle True, an event, the metric
// tessera_controller_idle_pods) and, with action Evict, evicts them
// through the Eviction API, a gang only whole. A refused eviction (429: a
// PodDisruptionBudget) is tried again on a later pass; nothing is deleted
// directly. The usage history is fed from every claim update the cache
// delivers (Observe) and from each pass. It runs on the leader only.
type IdleReclaimer struct {
	Client   client.Client
	Reader   client.Reader
	Recorder recorder.EventRecorder
	Metrics  *Metrics
	// Informers, when set, delivers every claim update to the history
	// (else only the passes sample claims).
	Informers cache.Informers
	Clock     clock.PassiveClock
	Interval  time.Duration
	Driver    string
	History   *idle.History
	// Controller is this controller's --controller-name: only its own
	// queues' policies apply (canary queues: owner.go).
	Controller string
	// Off (feature gate IdleReclaim off): every pass ignores spec.idle.
	Off bool

	mu sync.Mutex
	// evicted remembers the pods this process evicted until the cache
	// shows them going, so that a lagging cache never evicts twice.
	evicted map[types.UID]time.Time
}

// NewIdleReclaimer returns a reclaimer with its defaults.
func NewIdleReclaimer(c client.Client, r client.Reader, rec recorder.EventRecorder, m *Metrics) *IdleReclaimer {
	return &IdleReclaimer{Client: c, Reader: r, Recorder: rec, Metrics: m, Clock: clock.RealClock{},
		Interval: defaultIdleInterval, Driver: devicemodel.DriverName, History: idle.NewHistory()}
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (r *IdleReclaimer) NeedLeaderElection() bool { return true }

// Start runs passes every Interval until ctx ends.
func (r *IdleReclaimer) Start(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("idle")
	ctx = klog.NewContext(ctx, logger)
	if r.Informers != nil {
		inf, err := r.Informers.GetInformer(ctx, &resourceapi.ResourceClaim{})
		if err != nil {
			return fmt.Errorf("claim informer: %w", err)
		}
		observe := func(obj any) {
			if c, ok := obj.(*resourceapi.ResourceClaim); ok {
				r.History.ObserveClaim(c, r.Driver)
			}
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    observe,
			UpdateFunc: func(_, obj any) { observe(obj) },
		}); err != nil {
			return fmt.Errorf("claim informer: %w", err)
		}
	}
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		if err := r.Pass(ctx); err != nil {
			logger.Error(err, "Idle reclaim pass failed; retrying next pass")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// idleMember is a pod under an idle policy with its verdict.
type idleMember struct {
	pod     *corev1.Pod
	verdict idle.Verdict
}

// Pass judges every pod under an idle policy once and acts on the verdicts.
func (r *IdleReclaimer) Pass(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	now := r.Clock.Now()
	var queues v1alpha1.QueueList
	if err := r.Reader.List(ctx, &queues); err != nil {
		return fmt.Errorf("listing queues: %w", err)
	}
	policies := map[string]*idle.Policy{}
	owner := newOwnership(r.Controller, ptrs(queues.Items))
	for i := range queues.Items {
		if r.Off {
			break
		}
		q := &queues.Items[i]
		if !owner.queue(q.Name) {
			continue
		}
		p, err := idle.PolicyOf(q)
		if err != nil {
			logger.Info("Warning: ignoring a queue's spec.idle", "queue", q.Name, "error", err.Error())
			continue
		}
		if p != nil {
			policies[q.Name] = p
		}
	}
	var claims resourceapi.ResourceClaimList
	if err := r.Reader.List(ctx, &claims); err != nil {
		return fmt.Errorf("listing claims: %w", err)
	}
	byName := map[types.NamespacedName]*resourceapi.ResourceClaim{}
	for i := range claims.Items {
		c := &claims.Items[i]
		r.History.ObserveClaim(c, r.Driver)
		byName[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = c
	}
	r.History.Sweep()
	counts := map[string]int{}
	for q := range policies {
		counts[q] = 0
	}
	defer func() { r.Metrics.idlePods(counts) }()
	if len(policies) == 0 {
		return nil
	}
	var pods corev1.PodList
	if err := r.Reader.List(ctx, &pods, client.HasLabels{v1alpha1.QueueLabel}); err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	// Workloads: a gang (namespace, queue, gang label) or a single pod.
	type workload struct {
		queue   string
		members []idleMember
		exempt  bool
		gang    bool
	}
	workloads := map[string]*workload{}
	r.mu.Lock()
	for uid, at := range r.evicted {
		if now.Sub(at) > memoTTL {
			delete(r.evicted, uid)
		}
	}
	r.mu.Unlock()
	for i := range pods.Items {
		p := &pods.Items[i]
		qn := p.Labels[v1alpha1.QueueLabel]
		pol := policies[qn]
		if pol == nil || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		key, gang := string(p.UID), false
		if g := p.Labels[v1alpha1.GangLabel]; g != "" {
			key, gang = p.Namespace+"/"+qn+"/"+g, true
		}
		w := workloads[key]
		if w == nil {
			w = &workload{queue: qn, gang: gang}
			workloads[key] = w
		}
		if p.Labels[v1alpha1.IdleExemptLabel] == "true" {
			w.exempt = true
		}
		v := idle.Verdict{Why: "not running"}
		if p.Status.Phase == corev1.PodRunning && !decide.HasAdmissionGate(p) && p.Annotations[v1alpha1.AdmittedAtAnnotation] != "" {
			v = idle.Judge(now, pol, podClaims(p, byName, r.Driver), r.History)
		}
		w.members = append(w.members, idleMember{pod: p, verdict: v})
	}
	keys := make([]string, 0, len(workloads))
	for k := range workloads {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		w := workloads[k]
		pol := policies[w.queue]
		verdicts := make([]idle.Verdict, len(w.members))
		for i, m := range w.members {
			verdicts[i] = m.verdict
		}
		v := idle.JudgeWorkload(verdicts)
		if w.exempt || !v.Idle {
			for _, m := range w.members {
				if c := idleCondition(m.pod); c != nil && c.Status == corev1.ConditionTrue {
					why := "in use again: " + m.verdict.Why
					if w.exempt {
						why = "exempt (" + v1alpha1.IdleExemptLabel + "=true)"
					}
					r.setIdleCondition(ctx, m.pod, corev1.ConditionFalse, ReasonIdleActive, why, now)
				}
			}
			continue
		}
		counts[w.queue] += len(w.members)
		msg := idle.Message(now, pol, v)
		for _, m := range w.members {
			if c := idleCondition(m.pod); c == nil || c.Status != corev1.ConditionTrue {
				logger.Info("Idle", "pod", klog.KObj(m.pod), "queue", w.queue, "action", pol.Action, "message", msg)
				r.Recorder.Eventf(m.pod, nil, corev1.EventTypeWarning, ReasonIdle, "Idle", msg)
				r.setIdleCondition(ctx, m.pod, corev1.ConditionTrue, ReasonIdle, msg, now)
			}
		}
		if pol.Action == v1alpha1.IdleEvict {
			r.evict(ctx, w.queue, w.members, w.gang, msg, now)
		}
	}
	return nil
}

// evict evicts a workload's members through the Eviction API. A gang is
// first evicted in a dry run, every member: only when the API would let
// every member go does any go (a PodDisruptionBudget that refuses one
// member keeps the whole gang). A 429 is waited out: the next pass tries
// again.
func (r *IdleReclaimer) evict(ctx context.Context, queue string, members []idleMember, gang bool, msg string, now time.Time) {
	logger := klog.FromContext(ctx)
	var todo []*corev1.Pod
	r.mu.Lock()
	for _, m := range members {
		if _, done := r.evicted[m.pod.UID]; !done {
			todo = append(todo, m.pod)
		}
	}
	r.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	refused := func(p *corev1.Pod, err error) {
		logger.Info("Idle eviction refused; trying again next pass", "pod", klog.KObj(p), "queue", queue, "error", err.Error())
		r.Metrics.idleEviction(queue, idleEvictionResultPDB)
		if c := idleCondition(p); c == nil || c.Reason != ReasonIdleEvictWaits {
			why := "eviction refused (" + err.Error() + "); retrying: " + msg
			r.Recorder.Eventf(p, nil, corev1.EventTypeWarning, ReasonIdleEvictWaits, "Evict", why)
			r.setIdleCondition(ctx, p, corev1.ConditionTrue, ReasonIdleEvictWaits, why, now)
		}
	}
	if gang && len(todo) > 1 {
		for _, p := range todo {
			if err := r.evictOne(ctx, p, true); err != nil {
				if !apierrors.IsNotFound(err) {
					refused(p, err)
				}
				return
			}
		}
	}
	for _, p := range todo {
		err := r.evictOne(ctx, p, false)
		switch {
		case err == nil:
			r.mu.Lock()
			if r.evicted == nil {
				r.evicted = map[types.UID]time.Time{}
			}
			r.evicted[p.UID] = now
			r.mu.Unlock()
			logger.Info("Evicted an idle pod", "pod", klog.KObj(p), "queue", queue, "message", msg)
			r.Metrics.idleEviction(queue, idleEvictionResultOK)
			r.Recorder.Eventf(p, nil, corev1.EventTypeWarning, ReasonIdleEvicted, "Evict", msg)
			r.setIdleCondition(ctx, p, corev1.ConditionTrue, ReasonIdleEvicted, "evicted: "+msg, now)
		case apierrors.IsNotFound(err):
		default:
			refused(p, err)
		}
	}
}

func (r *IdleReclaimer) evictOne(ctx context.Context, p *corev1.Pod, dryRun bool) error {
	return evictPod(ctx, r.Client, p, nil, dryRun)
}

// podClaims are the UIDs of the pod's claims that hold devices of the
// driver, however the pod asked for them (podclaims.PodClaims: its
// resourceClaims and the claim kube-scheduler made for its extended
// resources); a claim not allocated yet, or of another driver, is left
// out, and a pod whose claims cannot all be found holds none that can be
// judged (it is not idle).
func podClaims(p *corev1.Pod, byName map[types.NamespacedName]*resourceapi.ResourceClaim, driver string) []types.UID {
	pcs, err := podclaims.PodClaims(p, runningObjects(byName))
	if err != nil {
		return nil
	}
	var out []types.UID
	for _, pc := range pcs {
		if !pc.Exists {
			continue
		}
		for _, d := range pc.Claim.Status.Devices {
			if d.Driver == driver {
				out = append(out, pc.Claim.UID)
				break
			}
		}
	}
	return out
}

// runningObjects looks up the claims of running pods: theirs all exist, so
// neither templates nor DeviceClasses are needed to resolve them.
type runningObjects map[types.NamespacedName]*resourceapi.ResourceClaim

func (o runningObjects) Claim(ns, name string) *resourceapi.ResourceClaim {
	return o[types.NamespacedName{Namespace: ns, Name: name}]
}

func (o runningObjects) Template(string, string) *resourceapi.ResourceClaimTemplate { return nil }

func (o runningObjects) ExtendedResources() *podclaims.ExtendedResources { return nil }

func idleCondition(p *corev1.Pod) *corev1.PodCondition {
	return findCondition(p, v1alpha1.IdleCondition)
}

// setIdleCondition writes the idle condition with a strategic merge patch
// (other writers' conditions are kept).
func (r *IdleReclaimer) setIdleCondition(ctx context.Context, p *corev1.Pod, status corev1.ConditionStatus, reason, message string, now time.Time) {
	t := metav1.NewTime(now)
	cond := corev1.PodCondition{Type: v1alpha1.IdleCondition, Status: status, Reason: reason, Message: message, LastProbeTime: t, LastTransitionTime: t}
	if c := idleCondition(p); c != nil && c.Status == status {
		cond.LastTransitionTime = c.LastTransitionTime
	}
	data, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.PodCondition{cond}}})
	if err != nil {
		return
	}
	target := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
	if err := r.Client.Status().Patch(ctx, target, client.RawPatch(types.StrategicMergePatchType, data)); err != nil && !apierrors.IsNotFound(err) {
		klog.FromContext(ctx).V(2).Info("Setting the idle condition failed", "pod", klog.KObj(p), "err", err)
	}
}
