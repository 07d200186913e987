package controller_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/pkg/control/decide"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/controller"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/webhook"
	"github.com/tessera-dev/tessera/test/apiserver"
	"github.com/tessera-dev/tessera/test/testutil"
)

type env struct {
	t    *testing.T
	cfg  *rest.Config
	c    client.Client
	ctx  context.Context
	opts controller.Options
	cur  *replica
}

// replica is one running controller.
type replica struct {
	t    *testing.T
	stop context.CancelFunc
	done chan error
}

func startEnv(t *testing.T) *env {
	s, err := apiserver.Start(t, apiserver.Options{CRDDirs: []string{testutil.Path(t, "deployments", "crds")}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.Config
	scheme, err := controller.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	e := &env{t: t, cfg: cfg, c: c, ctx: ctx}
	e.opts = controller.Options{
		Namespace:               "kube-system",
		LeaderElect:             true,
		LeaderElectionID:        "tessera-controller-test",
		LeaderElectionLease:     4 * time.Second,
		LeaderElectionRenewTime: 3 * time.Second,
		MetricsBindAddress:      "0",
		HealthProbeBindAddress:  "0",
		WebhookHost:             "127.0.0.1",
		WebhookPort:             testutil.FreePort(t),
		WebhookConfig:           controller.WebhookURL,
		WebhookCertSecret:       "tessera-controller-webhook-tls",
		Reclaim:                 true,
		PinNodes:                controller.PinGangs,
		CycleInterval:           50 * time.Millisecond,
		ResyncPeriod:            2 * time.Second,
		ApplyWorkers:            8,
		MaxReasonUpdates:        256,
	}
	ctrl.SetLogger(klog.FromContext(ctx))
	return e
}

// startController runs a controller (the current one) until
// stopController.
func (e *env) startController() {
	e.t.Helper()
	e.cur = e.startReplica(e.opts.WebhookPort)
	// The webhook answers once the configurations point at it.
	testutil.Eventually(e.t, 30*time.Second, "webhook serving", func() error {
		q := decidetest.Queue("probe-"+fmt.Sprint(time.Now().UnixNano()), "no-such-parent", "", "")
		err := e.c.Create(e.ctx, q, client.DryRunAll)
		if err == nil || !strings.Contains(err.Error(), "does not exist") {
			return fmt.Errorf("queue with unknown parent not refused by the webhook: %v", err)
		}
		return nil
	})
}

func (e *env) startReplica(port int) *replica {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	opts := e.opts
	opts.WebhookPort = port
	opts.Registry = prometheus.NewRegistry()
	mgr, err := controller.New(ctx, rest.CopyConfig(e.cfg), opts)
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	r := &replica{t: e.t, stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- mgr.Start(ctx) }()
	return r
}

func (r *replica) shutdown() {
	r.stop()
	if err := <-r.done; err != nil && !errors.Is(err, context.Canceled) {
		r.t.Errorf("controller: %v", err)
	}
}

func (e *env) stopController() { e.cur.shutdown() }

// gpuNode creates the device classes and a Ready node with mock GPUs of
// the profile, whose ResourceSlices it publishes as the kubelet plugin
// would, and returns them.
func (e *env) gpuNode(name, profile string) []*resourceapi.ResourceSlice {
	e.t.Helper()
	slices, err := decidetest.NodeSlices(name, decidetest.NodeOptions{Profile: profile})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, dc := range decidetest.Classes() {
		e.create(dc)
	}
	for _, s := range slices {
		s := s.DeepCopy()
		s.TypeMeta = metav1.TypeMeta{}
		e.create(s)
	}
	e.readyNode(name)
	return slices
}

// readyNode creates a Ready node. The API server taints new nodes
// not-ready; envtest runs no node lifecycle controller to lift it.
func (e *env) readyNode(name string) {
	e.t.Helper()
	node := decidetest.Node(name)
	status := node.Status
	e.create(node)
	node.Spec.Taints = nil
	if err := e.c.Update(e.ctx, node); err != nil {
		e.t.Fatal(err)
	}
	node.Status = status
	if err := e.c.Status().Update(e.ctx, node); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) create(objs ...client.Object) {
	e.t.Helper()
	for _, o := range objs {
		if err := e.c.Create(e.ctx, o); err != nil {
			e.t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
}

func (e *env) pod(name string) *corev1.Pod {
	e.t.Helper()
	var p corev1.Pod
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: "default", Name: name}, &p); err != nil {
		e.t.Fatal(err)
	}
	return &p
}

func gated(p *corev1.Pod) bool {
	for _, g := range p.Spec.SchedulingGates {
		if g.Name == v1alpha1.AdmissionGate {
			return true
		}
	}
	return false
}

func condition(p *corev1.Pod) *corev1.PodCondition { return decide.AdmissionCondition(p) }

func (e *env) waitAdmitted(names ...string) {
	e.t.Helper()
	for _, n := range names {
		testutil.Eventually(e.t, 30*time.Second, "pod "+n+" admitted", func() error {
			p := e.pod(n)
			if gated(p) {
				c := condition(p)
				if c != nil {
					return fmt.Errorf("still gated: %s: %s", c.Reason, c.Message)
				}
				return fmt.Errorf("still gated")
			}
			// The ungating patch records the admission; a condition is
			// there only where the pod was told something before, and
			// then it says Admitted.
			if p.Annotations[v1alpha1.AdmittedAtAnnotation] == "" || p.Annotations[v1alpha1.AdmittedByAnnotation] == "" {
				return fmt.Errorf("ungated without the admission annotations: %v", p.Annotations)
			}
			if c := condition(p); c != nil && (c.Status != corev1.ConditionTrue || c.Reason != decide.ReasonAdmitted) {
				return fmt.Errorf("a stale admission condition: %+v", c)
			}
			return nil
		})
	}
}

func (e *env) waitWaiting(name, reason, message string) {
	e.t.Helper()
	testutil.Eventually(e.t, 30*time.Second, "pod "+name+" explains why it waits", func() error {
		p := e.pod(name)
		c := condition(p)
		if !gated(p) {
			return fmt.Errorf("pod was admitted")
		}
		if c == nil || c.Reason != reason || !strings.Contains(c.Message, message) {
			return fmt.Errorf("condition %+v, want %s %q", c, reason, message)
		}
		return nil
	})
	testutil.Eventually(e.t, 30*time.Second, "event on pod "+name, func() error {
		var evs eventsv1.EventList
		if err := e.c.List(e.ctx, &evs, client.InNamespace("default")); err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Regarding.Name == name && ev.Reason == reason && strings.Contains(ev.Note, message) {
				return nil
			}
		}
		return fmt.Errorf("no event %s %q among %d", reason, message, len(evs.Items))
	})
}

// waitQueueEvent waits for an event on the (cluster-scoped) queue, which
// the API keeps in the default namespace.
func (e *env) waitQueueEvent(queue, reason, note string) {
	e.t.Helper()
	testutil.Eventually(e.t, 30*time.Second, "event on queue "+queue, func() error {
		var evs eventsv1.EventList
		if err := e.c.List(e.ctx, &evs, client.InNamespace("default")); err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Regarding.Kind == "Queue" && ev.Regarding.Name == queue && ev.Reason == reason && ev.Note == note {
				return nil
			}
		}
		return fmt.Errorf("no event %s %q on queue %s among %d", reason, note, queue, len(evs.Items))
	})
}

// allocate plays kube-scheduler for a pod: allocates its (direct) claims on
// the node with the scheduler's allocator and binds nothing (envtest runs no
// scheduler; the controller only reads claim allocations).
func (e *env) allocate(node string, slices []*resourceapi.ResourceSlice, claimNames ...string) {
	e.t.Helper()
	var all resourceapi.ResourceClaimList
	if err := e.c.List(e.ctx, &all); err != nil {
		e.t.Fatal(err)
	}
	state := allocation.NewState()
	for i := range all.Items {
		if a := all.Items[i].Status.Allocation; a != nil {
			state.Add(a)
		}
	}
	for _, name := range claimNames {
		var c resourceapi.ResourceClaim
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: "default", Name: name}, &c); err != nil {
			e.t.Fatal(err)
		}
		res, err := allocation.NewAllocator(slices, decidetest.Classes()).Allocate(e.ctx, decidetest.Node(node), state, &c)
		if err != nil || res == nil {
			e.t.Fatalf("allocating claim %s: %v %v", name, res, err)
		}
		state.Add(&res[0])
		c.Status.Allocation = &res[0]
		if err := e.c.Status().Update(e.ctx, &c); err != nil {
			e.t.Fatal(err)
		}
	}
}

// reportUsage writes what the kubelet plugin writes into an allocated
// claim's status.devices: each device's DeviceStatus with a usage sample.
func (e *env) reportUsage(name string, used uint64) {
	e.t.Helper()
	var c resourceapi.ResourceClaim
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: "default", Name: name}, &c); err != nil {
		e.t.Fatal(err)
	}
	c.Status.Devices = nil
	for _, r := range c.Status.Allocation.Devices.Results {
		raw, err := json.Marshal(v1alpha1.DeviceStatus{UUID: "GPU-x", Usage: &v1alpha1.DeviceUsage{MemoryUsedBytes: used, Processes: 1, SampledAt: metav1.Now()}})
		if err != nil {
			e.t.Fatal(err)
		}
		st := resourceapi.AllocatedDeviceStatus{Driver: r.Driver, Pool: r.Pool, Device: r.Device, Data: &runtime.RawExtension{Raw: raw}}
		if r.ShareID != nil {
			st.ShareID = ptr.To(string(*r.ShareID))
		}
		c.Status.Devices = append(c.Status.Devices, st)
		used = 0 // once per claim
	}
	if err := e.c.Status().Update(e.ctx, &c); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) queueStatus(name string) v1alpha1.QueueStatus {
	var q v1alpha1.Queue
	if err := e.c.Get(e.ctx, client.ObjectKey{Name: name}, &q); err != nil {
		e.t.Fatal(err)
	}
	return q.Status
}

func qty(l v1alpha1.ResourceList, r v1alpha1.ResourceName) string {
	q, ok := l[r]
	if !ok {
		return ""
	}
	return q.String()
}

func claimPod(name, queue string, claims ...string) *corev1.Pod {
	return decidetest.Pod("default", name, decidetest.PodOptions{Queue: queue, Claims: claims})
}

func claim(name string, reqs ...decidetest.Request) *resourceapi.ResourceClaim {
	c := decidetest.Claim("default", name, reqs...)
	c.UID = ""
	return c
}

func asNew(p *corev1.Pod) *corev1.Pod { p.UID = ""; return p }

// TestController runs the controller against a real kube-apiserver: the
// webhooks, gates, reasons, gangs, queue status, a restart and leader
// election.
func TestController(t *testing.T) {
	e := startEnv(t)
	// A node with 8 x H100, published as the kubelet plugin publishes.
	slices := e.gpuNode("node-1", "dgxh100")
	e.create(decidetest.Queue("org", "", "", ""), decidetest.Queue("team-a", "org", "16Gi", "16Gi"), decidetest.Queue("team-b", "org", "", ""))

	e.startController()

	t.Run("queue validation", func(t *testing.T) {
		for _, tc := range []struct {
			q    *v1alpha1.Queue
			want string
		}{
			{decidetest.Queue("x", "nope", "", ""), `queue "nope" does not exist`},
			{decidetest.Queue("x", "", "32Gi", "16Gi"), "quota must not be above limit"},
			{decidetest.Queue("x", "x", "", ""), "cannot be its own parent"},
		} {
			err := e.c.Create(e.ctx, tc.q)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("creating %+v: %v, want %q", tc.q.Spec, err, tc.want)
			}
		}
		// A cycle through an update.
		var org v1alpha1.Queue
		if err := e.c.Get(e.ctx, client.ObjectKey{Name: "org"}, &org); err != nil {
			t.Fatal(err)
		}
		org.Spec.Parent = "team-a"
		if err := e.c.Update(e.ctx, &org); err == nil || !strings.Contains(err.Error(), "would make a cycle (org -> team-a -> org)") {
			t.Errorf("cycle: %v", err)
		}
		if err := e.c.Delete(e.ctx, &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "org"}}); err == nil || !strings.Contains(err.Error(), "queue org is the parent of team-a, team-b") {
			t.Errorf("deleting a parent: %v", err)
		}
	})

	t.Run("webhook gates only labelled pods", func(t *testing.T) {
		e.create(decidetest.Pod("default", "plain", decidetest.PodOptions{}))
		if p := e.pod("plain"); gated(p) {
			t.Error("unlabelled pod was gated")
		}
	})

	t.Run("admission, limit reason, accounting from the allocation", func(t *testing.T) {
		e.create(claim("a12", decidetest.Request{Memory: "12Gi"}), claim("a8", decidetest.Request{Memory: "8Gi"}))
		e.create(asNew(claimPod("a1", "team-a", "a12")))
		if !gated(e.pod("a1")) && condition(e.pod("a1")) == nil {
			t.Error("labelled pod was not gated at creation")
		}
		e.waitAdmitted("a1")
		// Admitted in its first cycle: no condition written, one event on
		// the queue for the cycle.
		if c := condition(e.pod("a1")); c != nil {
			t.Errorf("a pod admitted without waiting got a condition written: %+v", c)
		}
		e.waitQueueEvent("team-a", "Admitted", "admitted 1 pods of 1 workloads: default/a1")
		testutil.Eventually(t, 30*time.Second, "team-a status", func() error {
			st := e.queueStatus("team-a")
			if qty(st.Allocated, v1alpha1.ResourceGPUMemory) != "12Gi" || st.AdmittedWorkloads != 1 {
				return fmt.Errorf("status %+v", st)
			}
			return nil
		})
		e.allocate("node-1", slices, "a12")
		// The kubelet plugin reports what the claim's processes use: the
		// queue and its parent show it next to the allocation.
		e.reportUsage("a12", 3<<30)
		testutil.Eventually(t, 30*time.Second, "team-a and org show 3Gi in use", func() error {
			for _, q := range []string{"team-a", "org"} {
				if st := e.queueStatus(q); qty(st.Used, v1alpha1.ResourceGPUMemory) != "3Gi" {
					return fmt.Errorf("queue %s: used %v, allocated %v", q, st.Used, st.Allocated)
				}
			}
			return nil
		})
		if table := e.table("team-a"); !strings.Contains(fmt.Sprint(table.Rows[0].Cells), "3Gi") {
			t.Errorf("kubectl get queues shows no memory in use: %v", table.Rows[0].Cells)
		}
		e.create(asNew(claimPod("a2", "team-a", "a8")))
		e.waitWaiting("a2", "QueueLimit", "queue team-a: needs 8Gi gpu memory; quota 16Gi, in use 12Gi, limit 16Gi")
		testutil.Eventually(t, 30*time.Second, "team-a pending", func() error {
			st := e.queueStatus("team-a")
			if qty(st.Pending, v1alpha1.ResourceGPUMemory) != "8Gi" || st.PendingWorkloads != 1 {
				return fmt.Errorf("status %+v", st)
			}
			return nil
		})
	})

	t.Run("bad input", func(t *testing.T) {
		e.create(asNew(decidetest.Pod("default", "lost", decidetest.PodOptions{Queue: "nope"})))
		e.waitWaiting("lost", "InvalidWorkload", "queue nope does not exist")
		e.create(asNew(decidetest.Pod("default", "toplevel", decidetest.PodOptions{Queue: "org"})))
		e.waitWaiting("toplevel", "InvalidWorkload", "queue org is not a leaf queue")
		e.create(asNew(decidetest.Pod("default", "nosize", decidetest.PodOptions{Queue: "team-b", Gang: "g"})))
		e.waitWaiting("nosize", "InvalidWorkload", "label tessera.dev/gang-size is missing")
	})

	t.Run("gang waits until all members fit, then starts together", func(t *testing.T) {
		// One GPU carries a1's share, five are taken whole: a gang of
		// 4 x 1 GPU waits.
		e.create(claim("hold", decidetest.Request{Count: 5}))
		e.create(asNew(claimPod("holder", "team-b", "hold")))
		e.waitAdmitted("holder")
		e.allocate("node-1", slices, "hold")
		for i := range 4 {
			name := fmt.Sprintf("train-%d", i)
			e.create(claim(name+"-gpu", decidetest.Request{}))
			e.create(asNew(decidetest.Pod("default", name, decidetest.PodOptions{Queue: "team-b", Gang: "train-1", GangSize: "4", Claims: []string{name + "-gpu"}})))
		}
		e.waitWaiting("train-3", "DoesNotFit", "gang train-1: 2 of 4 members' claims fit")
		// The holder ends: its claim is deallocated.
		var hold resourceapi.ResourceClaim
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: "default", Name: "hold"}, &hold); err != nil {
			t.Fatal(err)
		}
		hold.Status.Allocation = nil
		if err := e.c.Status().Update(e.ctx, &hold); err != nil {
			t.Fatal(err)
		}
		if err := e.c.Delete(e.ctx, e.pod("holder")); err != nil {
			t.Fatal(err)
		}
		e.waitAdmitted("train-0", "train-1", "train-2", "train-3")
		// The gang waited: its condition said DoesNotFit, and now says
		// Admitted; the queue has one event for the four pods.
		if c := condition(e.pod("train-3")); c == nil || c.Reason != decide.ReasonAdmitted {
			t.Errorf("train-3 waited, then was admitted: condition %+v", c)
		}
		e.waitQueueEvent("team-b", "Admitted", "admitted 4 pods of 1 workloads: default/train-1")
		for i := range 4 {
			p := e.pod(fmt.Sprintf("train-%d", i))
			if pinnedTo(p) != "node-1" || p.Annotations[v1alpha1.NodeAnnotation] != "node-1" {
				t.Errorf("%s not pinned to node-1: %v %v", p.Name, p.Spec.Affinity, p.Annotations)
			}
		}
	})

	t.Run("printer columns", func(t *testing.T) {
		table := e.table("team-a")
		want := []string{"Name", "Parent", "Mem-Quota", "Mem-Limit", "Mem-Alloc", "Mem-InUse", "Mem-Fair", "GPUs-Alloc", "Admitted", "Pending", "Age"}
		var got []string
		for _, c := range table.ColumnDefinitions {
			if c.Priority == 0 {
				got = append(got, c.Name)
			}
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("columns %v, want %v", got, want)
		}
		row := fmt.Sprint(table.Rows[0].Cells)
		for _, v := range []string{"team-a", "org", "16Gi", "12Gi"} {
			if !strings.Contains(row, v) {
				t.Errorf("row %s lacks %s", row, v)
			}
		}
	})

	t.Run("restart rebuilds from the API", func(t *testing.T) {
		before := e.queueStatus("team-b")
		e.stopController()
		// While the controller is down a pod arrives (the webhook is down
		// too: creating a labelled pod fails closed).
		err := e.c.Create(e.ctx, asNew(claimPod("during-outage", "team-a", "a8")))
		if err == nil {
			t.Error("labelled pod created while the webhook is down: the gate would be missing")
		}
		e.startController()
		testutil.Eventually(t, 30*time.Second, "status after restart", func() error {
			st := e.queueStatus("team-b")
			if st.AdmittedWorkloads != before.AdmittedWorkloads || qty(st.Allocated, v1alpha1.ResourceGPUs) != qty(before.Allocated, v1alpha1.ResourceGPUs) {
				return fmt.Errorf("team-b %+v, before restart %+v", st, before)
			}
			return nil
		})
		e.waitWaiting("a2", "QueueLimit", "in use 12Gi")
		if !gated(e.pod("a2")) {
			t.Error("a2 admitted after restart")
		}
	})

	t.Run("reclaim evicts an over-quota gang for a queue within quota", func(t *testing.T) {
		// team-b (no quota) runs the 4-GPU gang; 3 GPUs are free. team-c is
		// guaranteed 4 GPUs' memory and asks for 4 GPUs.
		e.create(decidetest.Queue("team-c", "", "400Gi", ""))
		e.create(claim("c4", decidetest.Request{Count: 4}))
		e.create(asNew(claimPod("c1", "team-c", "c4")))
		testutil.Eventually(t, 30*time.Second, "gang evicted", func() error {
			var pods corev1.PodList
			if err := e.c.List(e.ctx, &pods, client.InNamespace("default"), client.MatchingLabels{v1alpha1.GangLabel: "train-1"}); err != nil {
				return err
			}
			if len(pods.Items) != 0 {
				return fmt.Errorf("%d gang members left", len(pods.Items))
			}
			return nil
		})
		e.waitAdmitted("c1")
		var evs eventsv1.EventList
		if err := e.c.List(e.ctx, &evs, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, ev := range evs.Items {
			if ev.Regarding.Name == "train-0" && ev.Reason == "Reclaimed" && strings.Contains(ev.Note, "reclaimed for pod c1 in queue team-c") {
				found = true
			}
		}
		if !found {
			t.Error("no Reclaimed event on train-0")
		}
	})

	t.Run("leader election: a second replica takes over", func(t *testing.T) {
		holder := func() string {
			var lease struct {
				Spec struct {
					HolderIdentity *string `json:"holderIdentity"`
				} `json:"spec"`
			}
			raw, err := e.rawGet("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/tessera-controller-test")
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(raw, &lease); err != nil {
				t.Fatal(err)
			}
			return ptr.Deref(lease.Spec.HolderIdentity, "")
		}
		first := holder()
		if first == "" {
			t.Fatal("no lease holder")
		}
		second := e.startReplica(testutil.FreePort(t))
		time.Sleep(2 * time.Second)
		if h := holder(); h != first {
			t.Fatalf("lease moved to %s while %s runs", h, first)
		}
		e.stopController() // releases the lease on the way out
		testutil.Eventually(t, 30*time.Second, "second replica leads", func() error {
			if h := holder(); h == first || h == "" {
				return fmt.Errorf("holder %q", h)
			}
			return nil
		})
		// The new leader admits (its own webhook now gates pods).
		e.create(claim("late", decidetest.Request{Memory: "1Gi"}))
		testutil.Eventually(t, 30*time.Second, "webhook of the second replica", func() error {
			err := e.c.Create(e.ctx, asNew(claimPod("late", "team-b", "late")))
			if apierrors.IsAlreadyExists(err) {
				return nil
			}
			return err
		})
		e.waitAdmitted("late")
		e.cur = second
	})

	e.stopController()
}

// rawGet reads a path of the API server.
func (e *env) rawGet(path string, accept ...string) ([]byte, error) {
	hc, err := rest.HTTPClientFor(e.cfg)
	if err != nil {
		return nil, err
	}
	host := e.cfg.Host
	if !strings.Contains(host, "://") {
		host = "https://" + host
	}
	req, err := http.NewRequestWithContext(e.ctx, http.MethodGet, strings.TrimSuffix(host, "/")+path, nil)
	if err != nil {
		return nil, err
	}
	if len(accept) > 0 {
		req.Header.Set("Accept", accept[0])
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", path, resp.Status, data)
	}
	return data, err
}

// table asks the API server for the table kubectl get prints.
func (e *env) table(name string) *metav1.Table {
	e.t.Helper()
	raw, err := e.rawGet("/apis/tessera.dev/v1alpha1/queues/"+name, "application/json;as=Table;v=v1;g=meta.k8s.io")
	if err != nil {
		e.t.Fatal(err)
	}
	var tbl metav1.Table
	if err := json.Unmarshal(raw, &tbl); err != nil {
		e.t.Fatal(err)
	}
	if len(tbl.Rows) != 1 {
		e.t.Fatalf("table has %d rows", len(tbl.Rows))
	}
	return &tbl
}

// TestControllerChartMode runs the controller the way the Helm chart does:
// the chart makes the webhook configurations (no caBundle) and an empty
// Secret; the controller fills the Secret with its CA and sets the
// configurations' caBundle, and nothing else.
func TestControllerChartMode(t *testing.T) {
	e := startEnv(t)
	port := testutil.FreePort(t)
	base := fmt.Sprintf("https://127.0.0.1:%d", port)
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	e.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "tessera-webhook-tls"}})
	e.create(&admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "tessera-pod-admission"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "pods.admission.tessera.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To(base + webhook.PodsPath)},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			ObjectSelector:          &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: v1alpha1.QueueLabel, Operator: metav1.LabelSelectorOpExists}}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
		}},
	})
	e.create(&admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "tessera-queue-validation"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "queues.validation.tessera.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To(base + webhook.QueuesPath)},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete}, Rule: admissionregistrationv1.Rule{APIGroups: []string{"tessera.dev"}, APIVersions: []string{"v1alpha1"}, Resources: []string{"queues"}}}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
		}},
	})
	e.opts.WebhookPort = port
	e.opts.WebhookConfig = controller.WebhookAuto
	e.opts.WebhookCertSecret = "tessera-webhook-tls"
	e.opts.WebhookCertHosts = []string{"127.0.0.1"}
	e.opts.MutatingConfiguration = "tessera-pod-admission"
	e.opts.ValidatingConfiguration = "tessera-queue-validation"
	e.opts.Complete(func(f string) bool { return f == "webhook-host" })
	if e.opts.WebhookConfig != controller.WebhookPatch {
		t.Fatalf("auto mode with configuration names resolved to %s", e.opts.WebhookConfig)
	}
	e.startController()
	defer e.stopController()
	var s corev1.Secret
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: "kube-system", Name: "tessera-webhook-tls"}, &s); err != nil || len(s.Data["ca.crt"]) == 0 {
		t.Fatalf("secret not filled: %v", err)
	}
	var m admissionregistrationv1.MutatingWebhookConfiguration
	if err := e.c.Get(e.ctx, client.ObjectKey{Name: "tessera-pod-admission"}, &m); err != nil {
		t.Fatal(err)
	}
	if string(m.Webhooks[0].ClientConfig.CABundle) != string(s.Data["ca.crt"]) || *m.Webhooks[0].ClientConfig.URL != base+webhook.PodsPath {
		t.Errorf("mutating configuration: caBundle not the Secret's CA, or more than the caBundle changed: %+v", m.Webhooks[0].ClientConfig)
	}
	e.create(decidetest.Queue("q", "", "", ""))
	e.create(asNew(decidetest.Pod("default", "p", decidetest.PodOptions{Queue: "q"})))
	e.waitAdmitted("p")
}
