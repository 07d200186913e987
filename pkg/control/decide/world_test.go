package decide_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/podclaims"
	"github.com/tessera-dev/tessera/pkg/control/sliceintern"
)

// world is a simulated cluster the tests drive: the engine decides, the
// world applies the decision the way the controller does (ungate, evict),
// and a simulated scheduler allocates the claims of ungated pods with the
// scheduler's allocator, like kube-scheduler would.
type world struct {
	t      testing.TB
	snap   decide.Snapshot
	eng    *decide.Engine
	clock  time.Time
	slices map[string][]*resourceapi.ResourceSlice
	// attrs is the controller's cache transform: the engine sees the
	// slices as the controller's cache keeps them (attributes in compact
	// form), the simulated scheduler as published (slices).
	attrs *sliceintern.Interner
	last  *decide.Decision
	// placed remembers where the admission put each pod, order in which.
	placed map[types.UID]string
	order  map[types.UID]int
	// budgets are the pods a PodDisruptionBudget protects while they run
	// (their eviction is refused with a 429 unless forced); refuse are the
	// pods whose eviction and deletion are refused outright (an admission
	// webhook); by name.
	budgets, refuse map[string]bool
	// forced counts pods deleted past their budget.
	forced int
}

// refusalTTL is how long the world (as the controller does) remembers a
// refused eviction.
const refusalTTL = time.Minute

func newWorld(t testing.TB, cfg decide.Config) *world {
	w := &world{t: t, eng: decide.NewEngine(cfg), clock: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		slices: map[string][]*resourceapi.ResourceSlice{}, placed: map[types.UID]string{}, order: map[types.UID]int{},
		budgets: map[string]bool{}, refuse: map[string]bool{}, attrs: sliceintern.New(0, nil)}
	w.snap = decide.Snapshot{Classes: decidetest.Classes(), Attributes: w.attrs}
	return w
}

func (w *world) tick() metav1.Time {
	w.clock = w.clock.Add(time.Second)
	return metav1.NewTime(w.clock)
}

func (w *world) node(name string, o decidetest.NodeOptions) {
	s, err := decidetest.NodeSlices(name, o)
	if err != nil {
		w.t.Fatal(err)
	}
	w.slices[name] = s
	for _, published := range s {
		cached := published.DeepCopy()
		cached.UID, cached.ResourceVersion = types.UID(name+"/"+cached.Name), "1"
		if _, err := w.attrs.Transform()(cached); err != nil {
			w.t.Fatal(err)
		}
		w.snap.Slices = append(w.snap.Slices, cached)
	}
	w.snap.Nodes = append(w.snap.Nodes, decidetest.Node(name))
}

// nics publishes n devices of another driver (nic.example.com, a NIC) on a
// node, in a pool named after the node as Tessera's is.
func (w *world) nics(node string, n int) {
	s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-nic"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: "nic.example.com", NodeName: ptr.To(node),
		Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
	}}
	for i := range n {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: fmt.Sprintf("nic-%d", i)})
	}
	w.slices[node] = append(w.slices[node], s)
	w.snap.Slices = append(w.snap.Slices, s)
}

func (w *world) queue(q *v1alpha1.Queue) { w.snap.Queues = append(w.snap.Queues, q) }

// namespace adds or relabels a namespace.
func (w *world) namespace(name string, labels map[string]string) {
	for _, ns := range w.snap.Namespaces {
		if ns.Name == name {
			ns.Labels = labels
			return
		}
	}
	w.snap.Namespaces = append(w.snap.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}})
}

func (w *world) template(t *resourceapi.ResourceClaimTemplate) {
	w.snap.Templates = append(w.snap.Templates, t)
}

func (w *world) claim(c *resourceapi.ResourceClaim) { w.snap.Claims = append(w.snap.Claims, c) }

// pod adds a gated pod (as the webhook would gate it).
func (w *world) pod(name string, o decidetest.PodOptions) *corev1.Pod {
	return w.podIn("ns", name, o)
}

// podIn is pod in namespace ns (names stay unique across namespaces).
func (w *world) podIn(ns, name string, o decidetest.PodOptions) *corev1.Pod {
	o.Gated = true
	o.Created = w.tick()
	p := decidetest.Pod(ns, name, o)
	w.snap.Pods = append(w.snap.Pods, p)
	return p
}

func (w *world) get(name string) *corev1.Pod {
	for _, p := range w.snap.Pods {
		if p.Name == name {
			return p
		}
	}
	w.t.Fatalf("no pod %s", name)
	return nil
}

// cycle decides and applies the decision.
func (w *world) cycle() *decide.Decision {
	w.t.Helper()
	w.snap.Now = w.clock
	w.ageRefusals()
	d, err := w.eng.Decide(context.Background(), &w.snap)
	if err != nil {
		w.t.Fatal(err)
	}
	now := w.tick()
	for _, a := range d.Admit {
		for _, p := range a.Pods {
			p.Spec.SchedulingGates = nil
			if n := a.Nodes[p.UID]; n != "" {
				if p.Annotations == nil {
					p.Annotations = map[string]string{}
				}
				p.Annotations[v1alpha1.NodeAnnotation] = n
			}
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: v1alpha1.AdmissionCondition, Status: corev1.ConditionTrue, LastTransitionTime: now})
			if v, ok := a.Holds[p.UID]; ok {
				if p.Annotations == nil {
					p.Annotations = map[string]string{}
				}
				p.Annotations[v1alpha1.AdmittedChargeAnnotation] = decide.FormatCharge(v)
			}
			w.placed[p.UID] = a.Nodes[p.UID]
			w.order[p.UID] = len(w.order)
		}
	}
	for _, e := range d.Evict {
		for _, p := range e.Pods {
			w.evict(p, e, now)
		}
	}
	w.last = d
	return d
}

// ageRefusals forgets refusals older than refusalTTL, as the controller
// does.
func (w *world) ageRefusals() {
	for uid, r := range w.snap.Refused {
		if w.clock.Sub(r.At) > refusalTTL {
			delete(w.snap.Refused, uid)
		}
	}
}

// evict applies an eviction to one pod as the API server would (and the
// controller after a budget's refusal when forced): refused outright for
// the pods in refuse, refused by the budget of a running pod in budgets
// unless forced, else deleted with the eviction's grace period (a pod
// already terminating only gets a shorter one).
func (w *world) evict(p *corev1.Pod, e *decide.Eviction, now metav1.Time) {
	if w.snap.Refused == nil {
		w.snap.Refused = map[types.UID]decide.Refusal{}
	}
	running := p.Spec.NodeName != "" && p.DeletionTimestamp == nil
	switch {
	case w.refuse[p.Name]:
		w.snap.Refused[p.UID] = decide.Refusal{At: now.Time}
		return
	case w.budgets[p.Name] && running && !e.Force:
		w.snap.Refused[p.UID] = decide.Refusal{At: now.Time, Budget: true}
		return
	case w.budgets[p.Name] && running:
		w.forced++
	}
	delete(w.snap.Refused, p.UID)
	g := decide.GraceSeconds(p, e.GracePeriod)
	if g == nil {
		g = ptr.To(int64(corev1.DefaultTerminationGracePeriodSeconds))
		if p.Spec.TerminationGracePeriodSeconds != nil {
			g = p.Spec.TerminationGracePeriodSeconds
		}
	}
	w.deleteWith(p, *g, now)
}

// deleteWith deletes a pod gracefully, as the API server does: the
// deadline is the deletion's start plus the grace period, and a pod
// already being deleted only takes a shorter one.
func (w *world) deleteWith(p *corev1.Pod, grace int64, now metav1.Time) {
	start := now.Time
	if p.DeletionTimestamp != nil {
		if p.DeletionGracePeriodSeconds != nil && grace >= *p.DeletionGracePeriodSeconds {
			return
		}
		old := int64(0)
		if p.DeletionGracePeriodSeconds != nil {
			old = *p.DeletionGracePeriodSeconds
		}
		start = p.DeletionTimestamp.Add(-time.Duration(old) * time.Second)
	}
	d := metav1.NewTime(start.Add(time.Duration(grace) * time.Second))
	p.DeletionTimestamp = &d
	p.DeletionGracePeriodSeconds = ptr.To(grace)
}

// schedule allocates the claims of ungated, unscheduled pods, on the node
// the admission simulated (or the first that fits), as kube-scheduler with
// the same allocator does, in the order the pods were ungated (the order of
// kube-scheduler's queue for pods of equal priority). Pods whose claims fit
// nowhere stay unscheduled.
func (w *world) schedule() {
	w.t.Helper()
	ctx := context.Background()
	states := map[string]*allocation.State{}
	for n := range w.slices {
		states[n] = allocation.NewState()
	}
	for _, c := range w.snap.Claims {
		if a := c.Status.Allocation; a != nil {
			states[nodeOf(a)].Add(a)
		}
	}
	var nodes []string
	for n := range w.slices {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	pods := append([]*corev1.Pod(nil), w.snap.Pods...)
	sort.SliceStable(pods, func(i, j int) bool { return w.order[pods[i].UID] < w.order[pods[j].UID] })
	for _, p := range pods {
		if p.Spec.NodeName != "" || decide.HasAdmissionGate(p) || p.DeletionTimestamp != nil || p.Status.Phase != "" {
			continue
		}
		claims := w.podClaims(p)
		order := nodes
		if n := w.placed[p.UID]; n != "" {
			order = append([]string{n}, nodes...)
		}
		var need []*resourceapi.ResourceClaim
		pin := ""
		for _, c := range claims {
			if c.Status.Allocation != nil {
				pin = nodeOf(c.Status.Allocation)
			} else {
				need = append(need, c)
			}
		}
		if pin != "" {
			order = []string{pin}
		}
		for _, n := range order {
			if len(need) == 0 {
				p.Spec.NodeName = n
				reserve(p, claims)
				break
			}
			res, err := allocation.NewAllocator(w.slices[n], w.snap.Classes).Allocate(ctx, decidetest.Node(n), states[n], need...)
			if err != nil {
				w.t.Fatal(err)
			}
			if res == nil {
				continue
			}
			for i, c := range need {
				c.Status.Allocation = &res[i]
				states[n].Add(&res[i])
			}
			p.Spec.NodeName = n
			reserve(p, claims)
			break
		}
	}
}

// reserve adds the pod to its claims' reservedFor, as the scheduler does
// when it binds.
func reserve(p *corev1.Pod, claims []*resourceapi.ResourceClaim) {
	for _, c := range claims {
		if !slices.ContainsFunc(c.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == p.UID }) {
			c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: p.UID})
		}
	}
}

// stop ends pods (Failed, as the kubelet marks a deleted pod it stopped)
// without releasing their claims: the moment before the resourceclaim
// controller deallocates them (release).
func (w *world) stop(names ...string) {
	for _, n := range names {
		w.get(n).Status.Phase = corev1.PodFailed
	}
}

// podClaims returns the pod's claims, creating the generated ones from
// templates as the resourceclaim controller does, and the claim of its
// extended resources as kube-scheduler does.
func (w *world) podClaims(p *corev1.Pod) []*resourceapi.ResourceClaim {
	var out []*resourceapi.ResourceClaim
	if st := p.Status.ExtendedResourceClaimStatus; st != nil {
		out = append(out, w.claimByName(st.ResourceClaimName))
	} else if spec := podclaims.NewExtendedResources(w.snap.Classes).ExtendedClaimSpec(p); spec != nil {
		name := p.Name + "-extended-resources-gen"
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: name, UID: types.UID("uid-" + name),
			Annotations: map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"}}, Spec: *spec}
		w.snap.Claims = append(w.snap.Claims, c)
		p.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: name}
		out = append(out, c)
	}
	for _, rc := range p.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil {
			out = append(out, w.claimByName(*rc.ResourceClaimName))
			continue
		}
		name := ""
		for _, s := range p.Status.ResourceClaimStatuses {
			if s.Name == rc.Name {
				name = *s.ResourceClaimName
			}
		}
		if name == "" {
			name = p.Name + "-" + rc.Name + "-gen"
			var tmpl *resourceapi.ResourceClaimTemplate
			for _, t := range w.snap.Templates {
				if t.Name == *rc.ResourceClaimTemplateName {
					tmpl = t
				}
			}
			c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: name, UID: types.UID("uid-" + name)}, Spec: tmpl.Spec.Spec}
			w.snap.Claims = append(w.snap.Claims, c)
			p.Status.ResourceClaimStatuses = append(p.Status.ResourceClaimStatuses, corev1.PodResourceClaimStatus{Name: rc.Name, ResourceClaimName: ptr.To(name)})
		}
		out = append(out, w.claimByName(name))
	}
	return out
}

func (w *world) claimByName(name string) *resourceapi.ResourceClaim {
	for _, c := range w.snap.Claims {
		if c.Name == name {
			return c
		}
	}
	w.t.Fatalf("no claim %s", name)
	return nil
}

func nodeOf(a *resourceapi.AllocationResult) string { return a.Devices.Results[0].Pool }

// finish ends pods (Succeeded) and deallocates claims no live pod uses, as
// the resourceclaim controller does.
func (w *world) finish(names ...string) {
	for _, n := range names {
		w.get(n).Status.Phase = corev1.PodSucceeded
	}
	w.release()
}

// remove deletes pods (an eviction completing) and releases their claims.
func (w *world) remove(names ...string) {
	drop := map[string]bool{}
	for _, n := range names {
		drop[n] = true
	}
	var keep []*corev1.Pod
	for _, p := range w.snap.Pods {
		if !drop[p.Name] {
			keep = append(keep, p)
		}
	}
	w.snap.Pods = keep
	w.release()
}

func (w *world) release() {
	inUse := map[string]bool{}
	for _, p := range w.snap.Pods {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, rc := range p.Spec.ResourceClaims {
			if rc.ResourceClaimName != nil {
				inUse[*rc.ResourceClaimName] = true
			}
		}
		for _, s := range p.Status.ResourceClaimStatuses {
			inUse[*s.ResourceClaimName] = true
		}
		if st := p.Status.ExtendedResourceClaimStatus; st != nil {
			inUse[st.ResourceClaimName] = true
		}
	}
	for _, c := range w.snap.Claims {
		if !inUse[c.Name] {
			c.Status.Allocation, c.Status.ReservedFor = nil, nil
		}
	}
}

// restart replaces the engine, as a controller restart does.
func (w *world) restart(cfg decide.Config) { w.eng = decide.NewEngine(cfg) }

func (w *world) admittedNames() []string {
	var out []string
	for _, a := range w.last.Admit {
		for _, p := range a.Pods {
			out = append(out, p.Name)
		}
	}
	sort.Strings(out)
	return out
}

func (w *world) verdict(pod string) *decide.Verdict {
	for _, v := range w.last.Waiting {
		for _, p := range v.Workload.Pods {
			if p.Name == pod {
				return v
			}
		}
	}
	return nil
}

func (w *world) evictedNames() []string {
	var out []string
	for _, e := range w.last.Evict {
		for _, p := range e.Pods {
			out = append(out, p.Name)
		}
	}
	sort.Strings(out)
	return out
}

func (w *world) status(q string) *v1alpha1.QueueStatus { return w.last.Queues[q] }

func mem(st *v1alpha1.QueueStatus, list string) string {
	var l v1alpha1.ResourceList
	switch list {
	case "allocated":
		l = st.Allocated
	case "pending":
		l = st.Pending
	case "fair":
		l = st.FairShare
	}
	q := l[v1alpha1.ResourceGPUMemory]
	return q.String()
}

func names(format string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf(format, i))
	}
	return out
}

func otherDriverClass() *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "nic.example.com"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "nic.example.com"`}}}}}
}
