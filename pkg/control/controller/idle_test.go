package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

// idlePod is a pod of the test queue with one claim of 10 GiB and the
// usage the plugin writes into the claim's status: (minute, bytes) pairs,
// each written when the test clock reaches its minute.
type idlePod struct {
	name, gang string
	exempt     bool
	usage      [][2]int64 // minute, MiB used; none: the claim has no sample
	refusals   int        // evictions answered 429 before one succeeds
}

const (
	gib        = int64(1) << 30
	mib        = int64(1) << 20
	idleWindow = 60 // minutes
)

// TestIdleReclaim runs the idle passes every 5 minutes of a fake clock for
// 150 minutes against a fake API (evictions intercepted: a PodDisruptionBudget
// is a 429) with spec.idle {after: 60m, usedBelow: 5%} and checks when each
// pod is marked and evicted.
func TestIdleReclaim(t *testing.T) {
	never := -1
	for _, tc := range []struct {
		name   string
		action v1alpha1.IdleAction
		pods   []idlePod
		// marked and evicted: the minute of the first pass that marks
		// (condition Idle True) and evicts each pod, by name; never: -1.
		marked, evicted map[string]int
	}{{
		name:    "busy pod not marked",
		action:  v1alpha1.IdleEvict,
		pods:    []idlePod{{name: "busy", usage: [][2]int64{{0, 0}, {30, 4096}}}},
		marked:  map[string]int{"busy": never},
		evicted: map[string]int{"busy": never},
	}, {
		name:    "idle pod marked after the window and evicted",
		action:  v1alpha1.IdleEvict,
		pods:    []idlePod{{name: "idle", usage: [][2]int64{{0, 100}}}},
		marked:  map[string]int{"idle": idleWindow},
		evicted: map[string]int{"idle": idleWindow},
	}, {
		name:    "idle pod only reported with Report",
		action:  v1alpha1.IdleReport,
		pods:    []idlePod{{name: "idle", usage: [][2]int64{{0, 0}}}},
		marked:  map[string]int{"idle": idleWindow},
		evicted: map[string]int{"idle": never},
	}, {
		name:   "the window restarts after a busy spell",
		action: v1alpha1.IdleEvict,
		// busy (2 GiB of 10) from 20 to 40: idle again from 40.
		pods:    []idlePod{{name: "spiky", usage: [][2]int64{{0, 0}, {20, 2048}, {40, 10}}}},
		marked:  map[string]int{"spiky": 40 + idleWindow},
		evicted: map[string]int{"spiky": 40 + idleWindow},
	}, {
		name:    "pod without samples never idle",
		action:  v1alpha1.IdleEvict,
		pods:    []idlePod{{name: "unsampled"}},
		marked:  map[string]int{"unsampled": never},
		evicted: map[string]int{"unsampled": never},
	}, {
		name:   "samples must cover the window",
		action: v1alpha1.IdleEvict,
		// First sampled at minute 50: covered from then on.
		pods:    []idlePod{{name: "late", usage: [][2]int64{{50, 0}}}},
		marked:  map[string]int{"late": 50 + idleWindow},
		evicted: map[string]int{"late": 50 + idleWindow},
	}, {
		name:    "exempt label",
		action:  v1alpha1.IdleEvict,
		pods:    []idlePod{{name: "exempt", exempt: true, usage: [][2]int64{{0, 0}}}},
		marked:  map[string]int{"exempt": never},
		evicted: map[string]int{"exempt": never},
	}, {
		name:   "gang with one busy member not evicted",
		action: v1alpha1.IdleEvict,
		pods: []idlePod{
			{name: "g-0", gang: "g", usage: [][2]int64{{0, 0}}},
			{name: "g-1", gang: "g", usage: [][2]int64{{0, 5000}}},
		},
		marked:  map[string]int{"g-0": never, "g-1": never},
		evicted: map[string]int{"g-0": never, "g-1": never},
	}, {
		name:   "idle gang evicted whole",
		action: v1alpha1.IdleEvict,
		pods: []idlePod{
			{name: "g-0", gang: "g", usage: [][2]int64{{0, 0}}},
			{name: "g-1", gang: "g", usage: [][2]int64{{10, 0}}},
		},
		marked:  map[string]int{"g-0": 10 + idleWindow, "g-1": 10 + idleWindow},
		evicted: map[string]int{"g-0": 10 + idleWindow, "g-1": 10 + idleWindow},
	}, {
		name:    "PDB refusal (429) retried",
		action:  v1alpha1.IdleEvict,
		pods:    []idlePod{{name: "guarded", usage: [][2]int64{{0, 0}}, refusals: 2}},
		marked:  map[string]int{"guarded": idleWindow},
		evicted: map[string]int{"guarded": idleWindow + 10},
	}, {
		name:   "a gang one member of which a PDB guards goes whole, later",
		action: v1alpha1.IdleEvict,
		pods: []idlePod{
			{name: "g-0", gang: "g", usage: [][2]int64{{0, 0}}},
			{name: "g-1", gang: "g", usage: [][2]int64{{0, 0}}, refusals: 1},
		},
		marked:  map[string]int{"g-0": idleWindow, "g-1": idleWindow},
		evicted: map[string]int{"g-0": idleWindow + 5, "g-1": idleWindow + 5},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			env := newIdleEnv(t, tc.action, tc.pods)
			marked, evicted := map[string]int{}, map[string]int{}
			for m := 0; m <= 150; m += 5 {
				env.step(m)
				gone := 0
				for _, p := range tc.pods {
					pod, ok := env.pod(p.name)
					// An evicted pod was marked in the same pass at the latest.
					if _, seen := marked[p.name]; !seen && (!ok || condTrue(pod)) {
						marked[p.name] = m
					}
					if _, seen := evicted[p.name]; !seen && !ok {
						evicted[p.name] = m
					}
					if !ok {
						gone++
					}
				}
				if tc.pods[0].gang != "" && gone != 0 && gone != len(tc.pods) {
					t.Fatalf("minute %d: %d of %d gang members evicted", m, gone, len(tc.pods))
				}
			}
			for _, p := range tc.pods {
				if got, ok := marked[p.name]; (ok && got != tc.marked[p.name]) || (!ok && tc.marked[p.name] != never) {
					t.Errorf("%s marked at minute %v (%v); want %d", p.name, got, ok, tc.marked[p.name])
				}
				if got, ok := evicted[p.name]; (ok && got != tc.evicted[p.name]) || (!ok && tc.evicted[p.name] != never) {
					t.Errorf("%s evicted at minute %v (%v); want %d", p.name, got, ok, tc.evicted[p.name])
				}
			}
			if t.Failed() {
				t.Logf("evictions tried: %v", env.tried)
			}
		})
	}
}

// TestIdleMetricAndEvents checks the gauge, the counter and the events of
// a Report queue and an Evict queue with a 429.
func TestIdleMetricAndEvents(t *testing.T) {
	env := newIdleEnv(t, v1alpha1.IdleEvict, []idlePod{{name: "guarded", usage: [][2]int64{{0, 0}}, refusals: 1}, {name: "busy", usage: [][2]int64{{0, 9000}}}})
	env.step(0)
	if err := testutil.GatherAndCompare(env.reg, strings.NewReader(`
# HELP tessera_controller_idle_pods Pods the last idle pass found idle under their queue's spec.idle (a gang's members only when all are idle), by queue; 0 for a queue with spec.idle and no idle pod.
# TYPE tessera_controller_idle_pods gauge
tessera_controller_idle_pods{queue="team"} 0
`), MetricIdlePods); err != nil {
		t.Error(err)
	}
	env.step(60)
	env.step(65)
	if err := testutil.GatherAndCompare(env.reg, strings.NewReader(`
# HELP tessera_controller_idle_evictions_total Evictions of idle pods (spec.idle action Evict) through the Eviction API, by queue and result: evicted, refused (a PodDisruptionBudget or another error; tried again next pass).
# TYPE tessera_controller_idle_evictions_total counter
tessera_controller_idle_evictions_total{queue="team",result="evicted"} 1
tessera_controller_idle_evictions_total{queue="team",result="refused"} 1
`), MetricIdleEvictionsTotal); err != nil {
		t.Error(err)
	}
	var reasons []string
	for len(env.events.Events) > 0 {
		e := <-env.events.Events
		reasons = append(reasons, strings.Fields(e)[1])
	}
	if got, want := strings.Join(reasons, ","), "Idle,IdleEvictionBlocked,IdleEvicted"; got != want {
		t.Errorf("events %s; want %s", got, want)
	}
}

type idleEnv struct {
	t      *testing.T
	c      client.Client
	r      *IdleReclaimer
	clock  *clocktesting.FakeClock
	reg    *prometheus.Registry
	events *events.FakeRecorder
	pods   []idlePod
	// refusals left per pod; tried lists the evictions tried.
	refusals map[string]int
	tried    []string
}

var idleT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newIdleEnv(t *testing.T, action v1alpha1.IdleAction, pods []idlePod) *idleEnv {
	t.Helper()
	scheme, err := NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "team"}, Spec: v1alpha1.QueueSpec{
		Idle: &v1alpha1.IdlePolicy{After: metav1.Duration{Duration: idleWindow * time.Minute}, UsedBelow: "5%", Action: action}}}
	objs := []client.Object{q}
	env := &idleEnv{t: t, pods: pods, refusals: map[string]int{}, clock: clocktesting.NewFakeClock(idleT0), reg: prometheus.NewRegistry(), events: events.NewFakeRecorder(100)}
	for _, p := range pods {
		env.refusals[p.name] = p.refusals
		labels := map[string]string{v1alpha1.QueueLabel: "team"}
		if p.gang != "" {
			labels[v1alpha1.GangLabel] = p.gang
			labels[v1alpha1.GangSizeLabel] = "2"
		}
		if p.exempt {
			labels[v1alpha1.IdleExemptLabel] = "true"
		}
		objs = append(objs, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: p.name, UID: types.UID("pod-" + p.name), Labels: labels,
				Annotations: map[string]string{v1alpha1.AdmittedAtAnnotation: idleT0.Format(time.RFC3339)}},
			Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "c", Image: "i"}},
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("claim-" + p.name)}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning},
		}, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "claim-" + p.name, UID: types.UID("claim-" + p.name)}})
	}
	env.c = fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&corev1.Pod{}, &v1alpha1.Queue{}, &resourceapi.ResourceClaim{}).
		WithInterceptorFuncs(interceptor.Funcs{SubResourceCreate: env.evict}).Build()
	env.r = NewIdleReclaimer(env.c, env.c, env.events, NewMetrics(env.reg))
	env.r.Clock = env.clock
	return env
}

// evict plays the Eviction API: a dry run changes nothing, a guarded pod
// is refused with 429 (and counts a refusal down: the budget lets it go
// later), else the pod is deleted.
func (e *idleEnv) evict(ctx context.Context, c client.Client, sub string, obj client.Object, subResource client.Object, _ ...client.SubResourceCreateOption) error {
	if sub != "eviction" {
		return fmt.Errorf("unexpected subresource %s", sub)
	}
	ev := subResource.(*policyv1.Eviction)
	dry := ev.DeleteOptions != nil && len(ev.DeleteOptions.DryRun) > 0
	e.tried = append(e.tried, fmt.Sprintf("%s(dry=%v)", obj.GetName(), dry))
	if e.refusals[obj.GetName()] > 0 {
		e.refusals[obj.GetName()]--
		return apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 10)
	}
	if dry {
		var p corev1.Pod
		return c.Get(ctx, client.ObjectKeyFromObject(obj), &p)
	}
	return c.Delete(ctx, obj)
}

// step moves the clock to minute m, writes the claims' usage as the
// plugin would (only when it changed) and runs a pass.
func (e *idleEnv) step(m int) {
	e.t.Helper()
	ctx := context.Background()
	now := idleT0.Add(time.Duration(m) * time.Minute)
	e.clock.SetTime(now)
	for _, p := range e.pods {
		var latest []int64
		for _, u := range p.usage {
			if u[0] <= int64(m) {
				latest = u[:]
			}
		}
		if latest == nil {
			continue
		}
		var c resourceapi.ResourceClaim
		if err := e.c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "claim-" + p.name}, &c); err != nil {
			e.t.Fatal(err)
		}
		procs := 0
		if latest[1] > 0 {
			procs = 1
		}
		raw, _ := json.Marshal(v1alpha1.DeviceStatus{UUID: "GPU-1", MemoryLimitBytes: uint64(10 * gib), ComputeLimit: 100,
			Usage: &v1alpha1.DeviceUsage{MemoryUsedBytes: uint64(latest[1] * mib), Processes: procs,
				SampledAt: metav1.NewTime(idleT0.Add(time.Duration(latest[0]) * time.Minute))}})
		c.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: devicemodel.DriverName, Pool: "node-1", Device: "gpu-0", Data: &runtime.RawExtension{Raw: raw}}}
		if err := e.c.Status().Update(ctx, &c); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := e.r.Pass(ctx); err != nil {
		e.t.Fatal(err)
	}
}

func (e *idleEnv) pod(name string) (*corev1.Pod, bool) {
	var p corev1.Pod
	err := e.c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: name}, &p)
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return &p, true
}

func condTrue(p *corev1.Pod) bool {
	c := idleCondition(p)
	return c != nil && c.Status == corev1.ConditionTrue
}

// podClaims finds the driver's claims however the pod asked for them: a
// claim it names, one made from its template, and the one kube-scheduler
// made for its extended resources (found through the pod's status).
func TestPodClaimsEveryWayIn(t *testing.T) {
	held := func(name, uid, driver string) *resourceapi.ResourceClaim {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(uid)}}
		c.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: driver, Pool: "n", Device: "gpu-0"}}
		return c
	}
	byName := map[types.NamespacedName]*resourceapi.ResourceClaim{}
	for _, c := range []*resourceapi.ResourceClaim{
		held("named", "u-named", "gpu.tessera.dev"), held("p-t0-x", "u-tmpl", "gpu.tessera.dev"),
		held("p-extended-resources-y", "u-ext", "gpu.tessera.dev"), held("nic", "u-nic", "nic.example.com"),
	} {
		byName[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = c
	}
	p := decidetest.Pod("ns", "p", decidetest.PodOptions{Templates: []string{"gpu"}, Claims: []string{"named", "nic"},
		Extended: map[string]string{decidetest.ImplicitGPU: "1"}})
	p.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "t0", ResourceClaimName: ptr.To("p-t0-x")}}
	p.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: "p-extended-resources-y"}
	got := podClaims(p, byName, "gpu.tessera.dev")
	want := []types.UID{"u-tmpl", "u-named", "u-ext"}
	if !slices.Equal(got, want) {
		t.Errorf("claims %v, want %v", got, want)
	}
	// A claim it names is gone: nothing to judge, the pod is not idle.
	delete(byName, types.NamespacedName{Namespace: "ns", Name: "named"})
	if got := podClaims(p, byName, "gpu.tessera.dev"); len(got) != 0 {
		t.Errorf("with a claim missing: %v, want none", got)
	}
}
