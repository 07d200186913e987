package decide_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	. "github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/queue"
)

func TestChargeAnnotationRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"memory=2147483648,gpus=1000000", true},
		{"gpus=0,memory=0", true},
		{"memory=1", false},
		{"memory=-1,gpus=0", false},
		{"memory=1,gpus=1,memory=2", false},
		{"memory=1,cpus=1", false},
		{"", false},
		{"memory=99999999999999999999,gpus=0", false},
	} {
		_, err := decide.ParseCharge(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("ParseCharge(%q): %v, want ok=%v", tc.in, err, tc.ok)
		}
	}
	v := queue.Vector{5 << 30, 250_000}
	if got, err := decide.ParseCharge(decide.FormatCharge(v)); err != nil || got != v {
		t.Errorf("round trip %v: %v %v", v, got, err)
	}
}

func findEviction(w *world, pod string) *decide.Eviction {
	for _, e := range w.last.Evict {
		for _, p := range e.Pods {
			if p.Name == pod {
				return e
			}
		}
	}
	return nil
}

// A claim used by pods of different queues: one rule, whatever the order.
func TestClaimSharedAcrossQueues(t *testing.T) {
	for _, tc := range []struct {
		name string
		// second pod's queue; whether it is admitted
		queue string
		admit bool
	}{
		{"same queue shares", "team-a", true},
		{"other queue waits", "team-b", false},
		{"other queue with limit 0 waits", "zero", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, cfg())
			w.node("n1", NodeOptions{Profile: "h100-80gb:1"})
			w.queue(Queue("team-a", "", "", ""))
			w.queue(Queue("team-b", "", "", ""))
			w.queue(Queue("zero", "", "0", "0"))
			w.claim(Claim("ns", "shared", Request{Memory: "10Gi"}))
			w.pod("a", PodOptions{Queue: "team-a", Claims: []string{"shared"}})
			w.cycle()
			expectAdmitted(t, w, "a")
			w.schedule()
			w.claimByName("shared").Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "a", UID: w.get("a").UID}}
			w.pod("b", PodOptions{Queue: tc.queue, Claims: []string{"shared"}})
			w.cycle()
			if tc.admit {
				expectAdmitted(t, w, "b")
			} else {
				expectAdmitted(t, w)
				expectVerdict(t, w, "b", decide.ReasonClaimInAnotherQueue, "pod b: claim shared is already used by a pod of another queue (or of none); pods sharing a claim must be in one queue")
				if v := w.verdict("b"); strings.Contains(v.Message, "team-a") || strings.Contains(v.Message, "ns/") {
					t.Errorf("message names another queue or namespace: %q", v.Message)
				}
			}
			// The charge stays with team-a while a runs, and never moves.
			if got := mem(w.status("team-a"), "allocated"); got != "10Gi" {
				t.Errorf("team-a allocated %s, want 10Gi", got)
			}
			if got := mem(w.status(tc.queue), "allocated"); tc.queue != "team-a" && got != "0" {
				t.Errorf("%s allocated %s, want 0", tc.queue, got)
			}
		})
	}
}

// The first user ends while the claim stays allocated (another unqueued
// user holds it): a pod of a queue with limit 0 that takes it over is
// charged at admission, so the limit refuses it.
func TestAllocatedClaimCountsAgainstLimit(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:1"})
	w.queue(Queue("team-a", "", "", ""))
	w.queue(Queue("zero", "", "0", "0"))
	w.claim(Claim("ns", "shared", Request{Memory: "10Gi"}))
	w.pod("a", PodOptions{Queue: "team-a", Claims: []string{"shared"}})
	w.cycle()
	w.schedule()
	alloc := w.claimByName("shared").Status.Allocation
	w.finish("a")
	// Still allocated: another pod outside the queues holds it too.
	w.claimByName("shared").Status.Allocation = alloc
	w.pod("z", PodOptions{Queue: "zero", Claims: []string{"shared"}})
	w.cycle()
	expectAdmitted(t, w)
	expectVerdict(t, w, "z", decide.ReasonQueueLimit, "queue zero: needs 10Gi gpu memory")
	if got := mem(w.status("zero"), "allocated"); got != "0" {
		t.Errorf("zero allocated %s, want 0", got)
	}
}

// A gang's running members stay charged when a member naming another queue
// arrives; their queue admits nothing past its limit.
func TestRunningGangStaysCharged(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:2"})
	w.queue(Queue("team-a", "", "20Gi", "20Gi"))
	w.queue(Queue("team-b", "", "", ""))
	w.template(Template("ns", "share10", Request{Memory: "10Gi"}))
	for _, n := range []string{"g1", "g2"} {
		w.pod(n, PodOptions{Queue: "team-a", Gang: "g", GangSize: "2", Templates: []string{"share10"}})
	}
	w.cycle()
	expectAdmitted(t, w, "g1", "g2")
	w.schedule()
	w.pod("g3", PodOptions{Queue: "team-b", Gang: "g", GangSize: "2", Templates: []string{"share10"}})
	w.pod("x", PodOptions{Queue: "team-a", Templates: []string{"share10"}})
	w.cycle()
	expectAdmitted(t, w)
	expectVerdict(t, w, "g3", decide.ReasonInvalid, "members name different queues")
	expectVerdict(t, w, "x", decide.ReasonQueueLimit, "in use 20Gi, limit 20Gi")
	if got := mem(w.status("team-a"), "allocated"); got != "20Gi" {
		t.Errorf("team-a allocated %s, want 20Gi (the running members)", got)
	}
}

// What a pod holds grows past what it was admitted with: within the limit it
// is charged and keeps running, over it it is evicted with OverLimit.
func TestGrownClaimCheckedAgainstLimit(t *testing.T) {
	for _, tc := range []struct {
		name, limit, bigger string
		evict               bool
	}{
		{"over the limit: evicted", "4Gi", "8Gi", true},
		{"within the limit: kept", "16Gi", "8Gi", false},
		{"same size: kept", "2Gi", "2Gi", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, cfg())
			w.node("n1", NodeOptions{Profile: "h100-80gb:1"})
			w.queue(Queue("team-a", "", "", tc.limit))
			w.claim(Claim("ns", "mine", Request{Memory: "2Gi"}))
			p := w.pod("p", PodOptions{Queue: "team-a", Claims: []string{"mine"}})
			// A gate of its own keeps it unscheduled: it waits for it.
			p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: "example.com/mine"})
			w.cycle()
			expectAdmitted(t, w)
			expectVerdict(t, w, "p", decide.ReasonWaitingForGates, "example.com/mine")
			p.Spec.SchedulingGates = p.Spec.SchedulingGates[:1]
			w.cycle()
			expectAdmitted(t, w, "p")
			if got := p.Annotations[v1alpha1.AdmittedChargeAnnotation]; !strings.HasPrefix(got, "memory=2147483648,") {
				t.Fatalf("admitted charge %q", got)
			}
			// The tenant recreates the claim bigger under the same name
			// before the scheduler allocates it.
			for i, c := range w.snap.Claims {
				if c.Name == "mine" {
					w.snap.Claims[i] = Claim("ns", "mine", Request{Memory: tc.bigger})
					w.snap.Claims[i].UID = "uid-recreated"
				}
			}
			w.schedule()
			w.cycle()
			e := findEviction(w, "p")
			if got := e != nil; got != tc.evict {
				t.Fatalf("evicted %v, want %v; evictions %v", got, tc.evict, w.evictedNames())
			}
			if e != nil && (e.Reason != decide.ReasonOverLimit || !strings.Contains(e.Message, "holds more than it was admitted with") || !strings.Contains(e.Message, "limit "+tc.limit)) {
				t.Errorf("eviction %s %q", e.Reason, e.Message)
			}
			if got := mem(w.status("team-a"), "allocated"); got != tc.bigger {
				t.Errorf("allocated %s, want %s (charged what it holds until gone)", got, tc.bigger)
			}
		})
	}
}

// adminAccess devices are charged like any others.
func TestAdminAccessCharged(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:1"})
	w.queue(Queue("team-a", "", "0", "0"))
	c := Claim("ns", "admin", Request{})
	c.Spec.Devices.Requests[0].Exactly.AdminAccess = ptr.To(true)
	w.claim(c)
	w.pod("p", PodOptions{Queue: "team-a", Claims: []string{"admin"}})
	w.cycle()
	expectAdmitted(t, w)
	expectVerdict(t, w, "p", decide.ReasonQueueLimit, "queue team-a")
}

// Pods already running in a namespace when it becomes managed are charged
// to its queue and shown in it; they are never reclaimed.
func TestManagedNamespaceChargesRunningPods(t *testing.T) {
	for _, tc := range []struct {
		name    string
		label   string
		charged string
	}{
		{"managed", "team-a", "10Gi"},
		{"unmanaged", "", "8Gi"}, // only the new pod, admitted
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, cfg())
			w.node("n1", NodeOptions{Profile: "h100-80gb:1"})
			w.queue(Queue("team-a", "", "", "16Gi"))
			// A pod outside any queue, running with an allocated claim.
			old := Pod("ns", "old", PodOptions{Claims: []string{"c"}})
			w.snap.Pods = append(w.snap.Pods, old)
			w.claim(Claim("ns", "c", Request{Memory: "10Gi"}))
			w.schedule()
			cl := w.claimByName("c")
			if cl.Status.Allocation == nil {
				t.Fatal("not allocated")
			}
			cl.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "old", UID: old.UID}}
			// The controller's cache holds only labelled pods.
			w.snap.Pods = nil
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", Labels: map[string]string{}}}
			if tc.label != "" {
				ns.Labels[v1alpha1.QueueLabel] = tc.label
				w.snap.Namespaces = []*corev1.Namespace{ns}
			}
			w.template(Template("ns", "share8", Request{Memory: "8Gi"}))
			w.pod("new", PodOptions{Queue: "team-a", Templates: []string{"share8"}})
			w.cycle()
			st := w.status("team-a")
			if got := mem(st, "allocated"); got != tc.charged {
				t.Errorf("allocated %s, want %s", got, tc.charged)
			}
			if tc.label != "" {
				expectAdmitted(t, w)
				expectVerdict(t, w, "new", decide.ReasonQueueLimit, "in use 10Gi, limit 16Gi")
				if st.AdmittedWorkloads != 1 {
					t.Errorf("admitted workloads %d, want 1 (the running pod)", st.AdmittedWorkloads)
				}
			} else {
				expectAdmitted(t, w, "new")
			}
			if len(w.last.Evict) != 0 {
				t.Errorf("evicted %v", w.evictedNames())
			}
		})
	}
}
