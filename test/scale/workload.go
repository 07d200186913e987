package scale

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tesserav1 "github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/controller"
	"github.com/tessera-dev/tessera/test/localcluster"
)

// workload is one measured batch of pods, created at once.
type workload struct {
	// name is short and goes into the namespace name.
	name  string
	title string
	pods  int
	// pod shapes pod i (name, labels, claims) on top of the common spec.
	pod func(i int, p *corev1.Pod)
	// profile: the run takes CPU profiles of the API server and the
	// scheduler while the workload runs.
	profile bool
	// flags are set on Tessera's controller for this workload (nil: the
	// chart's own).
	flags map[string]string
	// setup, when set, prepares the workload's namespace and cluster
	// before it is measured; what it returns undoes it once the
	// namespace is gone.
	setup func(ctx context.Context, h *harness, ns string) (restore func(context.Context) error, err error)
	// nsLabels label the workload's namespace (nil: none).
	nsLabels map[string]string
}

// workloads are the runs in order, each baseline right before what it is
// compared with: (b), then (a') (the same pods with share claims but no
// queue: what DRA costs without Tessera's admission), then (a), the 512
// ungated whole GPUs then the gangs (c) and (d).
func workloads(cfg Config) []workload {
	claim := useClaim
	gang := func(p *corev1.Pod, name string, size int) {
		p.Labels[tesserav1.QueueLabel] = gangQueue
		p.Labels[tesserav1.GangLabel] = name
		p.Labels[tesserav1.GangSizeLabel] = strconv.Itoa(size)
		claim(p, wholeTemplate)
	}
	noPin := map[string]string{"--pin-nodes": "none"}
	all := append([]workload{
		{name: "plain", title: fmt.Sprintf("(b) %d pods, no claim, no queue", cfg.Pods), pods: cfg.Pods, profile: true,
			pod: func(int, *corev1.Pod) {}},
		{name: "claims", title: fmt.Sprintf("(a') %d pods, a %s share claim each, no queue", cfg.Pods, cfg.Share), pods: cfg.Pods, profile: true,
			pod: func(_ int, p *corev1.Pod) { claim(p, shareTemplate) }},
		{name: "shares", title: fmt.Sprintf("(a) %d pods, a %s share claim each, %d queues", cfg.Pods, cfg.Share, cfg.Queues), pods: cfg.Pods, profile: true,
			pod: func(i int, p *corev1.Pod) {
				p.Labels[tesserav1.QueueLabel] = leafQueue(i % cfg.Queues)
				claim(p, shareTemplate)
			}},
		// The pin's own effect: (a) again with the controller pinning nothing.
		{name: "shares-nopin", title: fmt.Sprintf("(a) again, controller with %s", describeFlags(noPin)), pods: cfg.Pods, flags: noPin,
			pod: func(i int, p *corev1.Pod) {
				p.Labels[tesserav1.QueueLabel] = leafQueue(i % cfg.Queues)
				claim(p, shareTemplate)
			}},
		{name: "ungated", title: fmt.Sprintf("%d pods, a whole GPU each, no queue or gang", cfg.BigGang), pods: cfg.BigGang,
			pod: func(_ int, p *corev1.Pod) { claim(p, wholeTemplate) }},
		{name: "gangs", title: fmt.Sprintf("(c) %d gangs of %d pods, a whole GPU each", cfg.Gangs, cfg.GangSize), pods: cfg.Gangs * cfg.GangSize,
			pod: func(i int, p *corev1.Pod) { gang(p, fmt.Sprintf("g%d", i/cfg.GangSize), cfg.GangSize) }},
		{name: "gang", title: fmt.Sprintf("(d) one gang of %d pods, a whole GPU each", cfg.BigGang), pods: cfg.BigGang,
			pod: func(_ int, p *corev1.Pod) { gang(p, "big", cfg.BigGang) }},
	}, migWorkloads(cfg)...)
	if cfg.SharesOnly {
		return all[:3] // (b), (a'), (a)
	}
	return all
}

// basePod is what every measured pod has: it tolerates and selects the fake
// nodes (nothing runs it; the kwok controller reports it Running).
func basePod(ns string, i int) *corev1.Pod {
	zero := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%05d", i), Namespace: ns, Labels: map[string]string{"app": "scale"}},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{localcluster.FakeNodeLabel: "true"},
			Tolerations:                   []corev1.Toleration{localcluster.FakeNodeToleration},
			TerminationGracePeriodSeconds: &zero,
			Containers:                    []corev1.Container{{Name: "c", Image: localcluster.BusyboxImage}},
		},
	}
}

// useClaim gives pod p a claim "gpu" from template, used by its container.
func useClaim(p *corev1.Pod, template string) {
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &template}}
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
}

// Result is what one workload measured.
type Result struct {
	Name, Title string
	Pods        int
	// Created is how long creating every pod took; AllBound how long
	// until the last was bound (both from the first create call).
	Created, AllBound time.Duration
	// Bound are the pods' bind times from the first create call, sorted.
	Bound []time.Duration
	// ControllerWrites are the mutating API calls of Tessera's controller;
	// Writes those of every component whose client metrics are read
	// (controller, scheduler, controller-manager), by component.
	ControllerWrites float64
	Writes           map[string]float64
	// APIRequests and APIWrites count the API server's requests;
	// TopWrites are its mutating requests by verb and resource.
	APIRequests, APIWrites float64
	TopWrites              []RequestGroup
	// SchedulingAttempt is the scheduler's
	// scheduler_scheduling_attempt_duration_seconds; DRA its
	// scheduler_plugin_execution_duration_seconds of the DynamicResources
	// plugin by extension point (sampled by the scheduler: 10% of cycles).
	SchedulingAttempt Histogram
	DRA               map[string]Histogram
	// Cycle is the controller's tessera_admission_cycle_seconds by phase
	// (decision cycles only); StatusRefresh its
	// tessera_queue_status_refresh_seconds (queue status refreshed with
	// nothing gated, no decision).
	Cycle         map[string]Histogram
	StatusRefresh Histogram
	// Usage is each component's CPU time and peak resident memory from the
	// first create call until the last pod was bound (Components).
	Usage map[string]Usage
	// Profiles summarise the CPU profiles of Profiled components, for the
	// workloads that take them.
	Profiles map[string]ProfileSummary
}

// CPUPerPod is the CPU time component used per bound pod.
func (r Result) CPUPerPod(component string) time.Duration {
	return r.Usage[component].CPU / time.Duration(r.Pods)
}

// Rate is the average of pods bound per second until the last.
func (r Result) Rate() float64 { return float64(r.Pods) / r.AllBound.Seconds() }

// measure creates the workload's pods in a namespace of their own, waits
// until all are bound and reads every component's metrics before and after.
// It deletes the namespace and waits until it is gone (claims deallocated)
// before it returns.
func (h *harness) measure(ctx context.Context, w workload) (*Result, error) {
	if err := h.configureController(ctx, w.flags); err != nil {
		return nil, fmt.Errorf("%s: %w", w.title, err)
	}
	ns := "scale-" + w.name
	if err := h.createNamespace(ctx, ns, w.nsLabels); err != nil {
		return nil, err
	}
	var restore func(context.Context) error
	defer func() {
		if err := h.deleteNamespace(ctx, ns); err != nil {
			h.logf("cleaning up %s: %v", ns, err)
		}
		if restore != nil {
			if err := restore(ctx); err != nil {
				h.logf("restoring the cluster after %s: %v", ns, err)
			}
		}
	}()
	if w.setup != nil {
		var err error
		if restore, err = w.setup(ctx, h, ns); err != nil {
			return nil, fmt.Errorf("%s: setting up: %w", w.title, err)
		}
	}
	var (
		mu    sync.Mutex
		bound = map[string]time.Duration{}
		start time.Time
	)
	record := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		mu.Lock()
		if _, seen := bound[p.Name]; !seen && !start.IsZero() {
			bound[p.Name] = time.Since(start)
		}
		mu.Unlock()
	}
	factory := informers.NewSharedInformerFactoryWithOptions(h.cs, 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, obj any) { record(obj) },
	}); err != nil {
		return nil, err
	}
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	factory.WaitForCacheSync(stop)

	before, err := scrapeAll(ctx, h.endpoints)
	if err != nil {
		return nil, err
	}
	procs := newProcSampler("/proc", Components)
	if err := procs.start(); err != nil {
		return nil, err
	}
	var prof *profiler
	if w.profile {
		prof = startProfiler(ctx, h.profiled(), h.profileDir)
	}
	h.logf("%s: creating %d pods", w.title, w.pods)
	mu.Lock()
	start = time.Now()
	mu.Unlock()
	err = parallel(ctx, w.pods, h.cfg.Workers, func(ctx context.Context, i int) error {
		p := basePod(ns, i)
		w.pod(i, p)
		_, err := h.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: creating pods: %w", w.title, err)
	}
	created := time.Since(start)
	deadline := start.Add(h.cfg.Timeout)
	lastLog := time.Now()
	for {
		mu.Lock()
		n := len(bound)
		mu.Unlock()
		if n >= w.pods {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s: %d of %d pods bound after %s; %s", w.title, n, w.pods, h.cfg.Timeout, h.pendingReasons(ctx, ns))
		}
		if time.Since(lastLog) > 15*time.Second {
			h.logf("  %d of %d bound after %s", n, w.pods, time.Since(start).Round(time.Second))
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	usage := procs.finish()
	var profiles map[string]ProfileSummary
	if prof != nil {
		if profiles, err = prof.finish(w.name); err != nil {
			return nil, err
		}
	}
	after, err := scrapeAll(ctx, h.endpoints)
	if err != nil {
		return nil, err
	}
	r := &Result{Name: w.name, Title: w.title, Pods: w.pods, Created: created, DRA: map[string]Histogram{}, Cycle: map[string]Histogram{},
		Usage: usage, Profiles: profiles}
	mu.Lock()
	for _, d := range bound {
		r.Bound = append(r.Bound, d)
	}
	mu.Unlock()
	sort.Slice(r.Bound, func(i, j int) bool { return r.Bound[i] < r.Bound[j] })
	r.AllBound = r.Bound[len(r.Bound)-1]
	r.Writes = map[string]float64{}
	for _, ep := range h.endpoints {
		if ep.name != "apiserver" {
			r.Writes[ep.name] = clientWrites(before[ep.name], after[ep.name])
		}
	}
	r.ControllerWrites = r.Writes["controller"]
	r.TopWrites, r.APIWrites = apiRequests(before["apiserver"], after["apiserver"], true)
	_, r.APIRequests = apiRequests(before["apiserver"], after["apiserver"], false)
	const attempt = "scheduler_scheduling_attempt_duration_seconds"
	r.SchedulingAttempt = sumHistogram(after["scheduler"], attempt, nil).minus(sumHistogram(before["scheduler"], attempt, nil))
	const plugins = "scheduler_plugin_execution_duration_seconds"
	for _, m := range after["scheduler"][plugins].GetMetric() {
		l := labels(m)
		if l["plugin"] != "DynamicResources" {
			continue
		}
		ep := l["extension_point"]
		match := func(l map[string]string) bool { return l["plugin"] == "DynamicResources" && l["extension_point"] == ep }
		r.DRA[ep] = sumHistogram(after["scheduler"], plugins, match).minus(sumHistogram(before["scheduler"], plugins, match))
	}
	const cycle = "tessera_admission_cycle_seconds"
	for _, phase := range []string{"decide", "apply"} {
		match := func(l map[string]string) bool { return l["phase"] == phase }
		r.Cycle[phase] = sumHistogram(after["controller"], cycle, match).minus(sumHistogram(before["controller"], cycle, match))
	}
	const refresh = "tessera_queue_status_refresh_seconds"
	r.StatusRefresh = sumHistogram(after["controller"], refresh, nil).minus(sumHistogram(before["controller"], refresh, nil))
	h.logf("%s: all %d bound in %s (created in %s; %.0f pods/s; controller writes %.0f; API server writes %.0f)",
		w.title, w.pods, r.AllBound.Round(100*time.Millisecond), created.Round(100*time.Millisecond), r.Rate(), r.ControllerWrites, r.APIWrites)
	return r, nil
}

// pendingReasons summarises why pods of ns are not bound, for a timeout's
// error: gated pods' admission messages and unschedulable pods' reasons.
func (h *harness) pendingReasons(ctx context.Context, ns string) string {
	pods, err := h.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	reasons := map[string]int{}
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" {
			continue
		}
		why := "no condition yet"
		for _, c := range p.Status.Conditions {
			if (c.Type == tesserav1.AdmissionCondition || c.Type == corev1.PodScheduled) && c.Status == corev1.ConditionFalse {
				why = string(c.Type) + ": " + c.Message
			}
		}
		if len(p.Spec.SchedulingGates) > 0 && why == "no condition yet" {
			why = "gated, no admission condition"
		}
		reasons[why]++
	}
	var out []string
	for why, n := range reasons {
		out = append(out, fmt.Sprintf("%d x %q", n, why))
	}
	sort.Strings(out)
	if len(out) > 5 {
		out = out[:5]
	}
	return "unbound: " + strings.Join(out, "; ") + h.replacedPods(ctx, ns)
}

// replacedPods names the pods of ns that Tessera's controller replaced
// because their pin went stale (its StalePin events: a bare pod is gone
// then, and the wait above counts it as unbound) and, for each node they
// were pinned to, the claims the API shows allocated there and the node's
// ResourceSlices: what the scheduler found taken.
func (h *harness) replacedPods(ctx context.Context, ns string) string {
	evs, err := h.cs.EventsV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + controller.ReasonStalePin})
	if err != nil || len(evs.Items) == 0 {
		return ""
	}
	var out []string
	nodes := map[string]bool{}
	for _, e := range evs.Items {
		if e.Reason != controller.ReasonStalePin {
			continue
		}
		out = append(out, fmt.Sprintf("%s replaced: %s", e.Regarding.Name, e.Note))
		if m := pinnedNodeRE.FindStringSubmatch(e.Note); m != nil {
			nodes[m[1]] = true
		}
	}
	if len(out) == 0 {
		return ""
	}
	claims, err := h.cs.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return "; " + strings.Join(append(out, err.Error()), "; ")
	}
	slices, err := h.cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "; " + strings.Join(append(out, err.Error()), "; ")
	}
	for node := range nodes {
		var held []string
		for _, c := range claims.Items {
			if c.Status.Allocation == nil {
				continue
			}
			for _, r := range c.Status.Allocation.Devices.Results {
				if r.Pool == node {
					held = append(held, fmt.Sprintf("%s/%s: %s (reserved for %d)", c.Namespace, c.Name, r.Device, len(c.Status.ReservedFor)))
				}
			}
		}
		var pools []string
		for _, s := range slices.Items {
			if s.Spec.Pool.Name == node {
				pools = append(pools, fmt.Sprintf("%s generation %d, %d devices", s.Name, s.Spec.Pool.Generation, len(s.Spec.Devices)))
			}
		}
		sort.Strings(held)
		out = append(out, fmt.Sprintf("node %s: %d devices allocated in the API [%s]; slices [%s]", node, len(held), strings.Join(held, ", "), strings.Join(pools, ", ")))
	}
	return "; " + strings.Join(out, "; ")
}

// pinnedNodeRE finds the node in a StalePin event's note.
var pinnedNodeRE = regexp.MustCompile(`pinned to node (\S+?),`)

func (h *harness) createNamespace(ctx context.Context, ns string, labels map[string]string) error {
	if err := h.deleteNamespace(ctx, ns); err != nil { // left by an interrupted run
		return err
	}
	if _, err := h.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for _, t := range claimTemplates(h.cfg) {
		if _, err := h.cs.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, t, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	// The namespace's default ServiceAccount: pods are refused without it.
	return waitUntil(ctx, time.Minute, "ServiceAccount "+ns+"/default", func() (bool, error) {
		_, err := h.cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
}

// deleteNamespace deletes ns's pods at once (nothing runs them), then the
// namespace, and waits until it is gone: its claims are deallocated then.
func (h *harness) deleteNamespace(ctx context.Context, ns string) error {
	zero := int64(0)
	// One call for all pods (the API server deletes them with the workers
	// ClusterOptions gives it); should it outlast the request timeout, the
	// API server goes on deleting, and the namespace's deletion below
	// deletes whatever it left.
	err := h.cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		h.logf("deleting the pods of %s: %v (the namespace's deletion goes on)", ns, err)
	}
	err = h.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	start := time.Now()
	err = waitUntil(ctx, 10*time.Minute, "namespace "+ns+" deleted", func() (bool, error) {
		_, err := h.cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err == nil {
		h.logf("deleted namespace %s in %s", ns, time.Since(start).Round(100*time.Millisecond))
	}
	return err
}

func waitUntil(ctx context.Context, timeout time.Duration, what string, check func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := check()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// harness is a scale run on a cluster that is up.
type harness struct {
	cfg       Config
	cs        kubernetes.Interface
	crc       client.Client
	endpoints []endpoint
	logf      localcluster.Logf
	// profileDir keeps the merged CPU profiles.
	profileDir string
	// chartArgs are the controller's arguments as the chart set them.
	chartArgs []string
}

// profiled are the endpoints of the Profiled components.
func (h *harness) profiled() []endpoint {
	var out []endpoint
	for _, ep := range h.endpoints {
		if slices.Contains(Profiled, ep.name) {
			out = append(out, ep)
		}
	}
	return out
}
