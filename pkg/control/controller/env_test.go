// The integration tests' environment: a real API server (envtest), the
// controller started and stopped as a replica, and helpers that play the
// scheduler and the kubelet plugin.

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
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	resourceapi "k8s.io/api/resource/v1"
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
	// Events go through the recorder's broadcaster, asynchronously: on a
	// loaded machine they trail the condition by tens of seconds.
	testutil.Eventually(e.t, 90*time.Second, "event on pod "+name, func() error {
		var evs eventsv1.EventList
		if err := e.c.List(e.ctx, &evs, client.InNamespace("default")); err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Regarding.Name != name || ev.Reason != reason {
				continue
			}
			// client-go's event recorder folds events that differ only in
			// their note into a series of the first one for 6 minutes
			// (tools/events: the isomorphism key has no note): when one
			// cycle's verdict follows another's with the same reason, only
			// the count of the first event grows. The condition above has
			// the current message; the event says the reason recurred.
			if strings.Contains(ev.Note, message) || ev.Series != nil {
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
	testutil.Eventually(e.t, 90*time.Second, "event on queue "+queue, func() error {
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
