package decide_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	. "github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
)

func cfg() decide.Config { return decide.DefaultConfig() }

func expectAdmitted(t *testing.T, w *world, want ...string) {
	t.Helper()
	got := w.admittedNames()
	if len(want) == 0 && len(got) == 0 {
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("admitted %v, want %v; waiting: %s", got, want, waiting(w))
	}
}

func waiting(w *world) string {
	var s []string
	for _, v := range w.last.Waiting {
		s = append(s, v.Workload.Key+": "+v.Message)
	}
	return strings.Join(s, " | ")
}

func expectVerdict(t *testing.T, w *world, pod, reason, message string) {
	t.Helper()
	v := w.verdict(pod)
	if v == nil {
		t.Fatalf("pod %s has no verdict; admitted %v", pod, w.admittedNames())
	}
	if v.Reason != reason || !strings.Contains(v.Message, message) {
		t.Fatalf("pod %s: verdict %s %q, want %s containing %q", pod, v.Reason, v.Message, reason, message)
	}
}

func TestAdmitAndAccountFromAllocation(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:1"})
	w.queue(Queue("team-a", "", "16Gi", "16Gi"))
	w.template(Template("ns", "share12", Request{Memory: "12Gi"}))
	w.template(Template("ns", "share8", Request{Memory: "8Gi"}))
	w.pod("p1", PodOptions{Queue: "team-a", Templates: []string{"share12"}})
	w.cycle()
	expectAdmitted(t, w, "p1")
	if got := mem(w.status("team-a"), "allocated"); got != "12Gi" {
		t.Errorf("allocated %s after admission, want 12Gi", got)
	}
	w.schedule()
	// The second pod needs 8Gi: quota 16Gi, 12Gi in use, limit 16Gi.
	w.pod("p2", PodOptions{Queue: "team-a", Templates: []string{"share8"}})
	w.cycle()
	expectAdmitted(t, w)
	expectVerdict(t, w, "p2", decide.ReasonQueueLimit, "queue team-a: needs 8Gi gpu memory; quota 16Gi, in use 12Gi, limit 16Gi")
	st := w.status("team-a")
	if mem(st, "allocated") != "12Gi" || mem(st, "pending") != "8Gi" || st.AdmittedWorkloads != 1 || st.PendingWorkloads != 1 {
		t.Errorf("status %+v", st)
	}
	// p1 ends: its claim is released and p2 fits.
	w.finish("p1")
	w.cycle()
	expectAdmitted(t, w, "p2")
}

func TestGangAllOrNothing(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:4"})
	w.queue(Queue("team-a", "", "", ""))
	w.template(Template("ns", "gpu", Request{}))
	// Two single-GPU pods hold two of the four GPUs.
	w.pod("hold-0", PodOptions{Queue: "team-a", Templates: []string{"gpu"}})
	w.pod("hold-1", PodOptions{Queue: "team-a", Templates: []string{"gpu"}})
	w.cycle()
	w.schedule()
	expectAdmitted(t, w, "hold-0", "hold-1")
	for _, n := range names("train-%d", 3) {
		w.pod(n, PodOptions{Queue: "team-a", Gang: "train", GangSize: "4", Templates: []string{"gpu"}})
	}
	w.cycle()
	expectVerdict(t, w, "train-0", decide.ReasonGangIncomplete, "gang train: 3 of 4 members exist")
	w.pod("train-3", PodOptions{Queue: "team-a", Gang: "train", GangSize: "4", Templates: []string{"gpu"}})
	w.cycle()
	expectAdmitted(t, w)
	expectVerdict(t, w, "train-3", decide.ReasonDoesNotFit, "gang train: 2 of 4 members' claims fit")
	w.finish("hold-0")
	w.cycle()
	expectVerdict(t, w, "train-0", decide.ReasonDoesNotFit, "gang train: 3 of 4 members' claims fit")
	w.finish("hold-1")
	w.cycle()
	expectAdmitted(t, w, "train-0", "train-1", "train-2", "train-3")
	w.schedule()
	for _, n := range names("train-%d", 4) {
		if w.get(n).Spec.NodeName != "n1" {
			t.Errorf("%s not scheduled", n)
		}
	}
}

func TestBadInputHoldsNothingUp(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:1"})
	w.queue(Queue("org", "", "", ""))
	w.queue(Queue("team-a", "org", "", ""))
	w.template(Template("ns", "share", Request{Memory: "1Gi"}))
	w.pod("unknown", PodOptions{Queue: "nope", Templates: []string{"share"}})
	w.pod("nonleaf", PodOptions{Queue: "org", Templates: []string{"share"}})
	w.pod("nosize", PodOptions{Queue: "team-a", Gang: "g1", Templates: []string{"share"}})
	w.pod("badsize", PodOptions{Queue: "team-a", Gang: "g2", GangSize: "four", Templates: []string{"share"}})
	w.pod("mixed-0", PodOptions{Queue: "team-a", Gang: "g3", GangSize: "2", Templates: []string{"share"}})
	w.pod("mixed-1", PodOptions{Queue: "org", Gang: "g3", GangSize: "2", Templates: []string{"share"}})
	w.pod("good", PodOptions{Queue: "team-a", Templates: []string{"share"}})
	w.cycle()
	expectAdmitted(t, w, "good")
	expectVerdict(t, w, "unknown", decide.ReasonInvalid, "queue nope does not exist")
	expectVerdict(t, w, "nonleaf", decide.ReasonInvalid, "queue org is not a leaf queue (it has children team-a)")
	expectVerdict(t, w, "nosize", decide.ReasonInvalid, "gang g1: label tessera.dev/gang-size is missing")
	expectVerdict(t, w, "badsize", decide.ReasonInvalid, `gang g2: label tessera.dev/gang-size="four" is not a positive number`)
	expectVerdict(t, w, "mixed-0", decide.ReasonInvalid, "gang g3: members name different queues (org, team-a)")
	for _, v := range w.last.Waiting {
		if !v.Invalid {
			t.Errorf("%s: not marked invalid: %s", v.Workload.Key, v.Message)
		}
	}
}

// TestOtherDriversDevices: a queued pod may also claim another driver's
// device (a NIC next to its GPU share, the usual training pod). That
// request charges nothing, but the simulation still places it against the
// NIC driver's slices, so pods that would not get a NIC are not admitted.
func TestOtherDriversDevices(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:1"})
	w.nics("n1", 1)
	w.queue(Queue("team-a", "", "40Gi", "40Gi"))
	w.snap.Classes = append(w.snap.Classes, otherDriverClass())
	w.template(Template("ns", "share", Request{Memory: "8Gi"}))
	w.template(Template("ns", "nic", Request{Class: "nic.example.com"}))
	w.pod("p1", PodOptions{Queue: "team-a", Templates: []string{"share", "nic"}})
	w.cycle()
	expectAdmitted(t, w, "p1")
	if got := mem(w.status("team-a"), "allocated"); got != "8Gi" {
		t.Errorf("allocated %s, want 8Gi: the NIC charges nothing", got)
	}
	w.schedule()
	if c := w.claimByName("p1-t1-gen"); c.Status.Allocation == nil || c.Status.Allocation.Devices.Results[0].Driver != "nic.example.com" {
		t.Fatalf("the scheduler did not allocate p1's NIC: %+v", c.Status.Allocation)
	}
	// Memory is left for a second pod, but no NIC: it waits.
	w.pod("p2", PodOptions{Queue: "team-a", Templates: []string{"share", "nic"}})
	w.cycle()
	expectAdmitted(t, w)
	if v := w.verdict("p2"); v == nil || v.Invalid {
		t.Errorf("p2 must wait for a NIC, not be invalid: %+v", v)
	}
	w.finish("p1")
	w.cycle()
	expectAdmitted(t, w, "p2")
}

func TestSharedClaimChargedOnce(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:1"})
	w.queue(Queue("team-a", "", "", ""))
	w.claim(Claim("ns", "shared", Request{Memory: "10Gi"}))
	w.pod("a", PodOptions{Queue: "team-a", Claims: []string{"shared"}})
	w.pod("b", PodOptions{Queue: "team-a", Claims: []string{"shared"}})
	w.cycle()
	expectAdmitted(t, w, "a", "b")
	if got := mem(w.status("team-a"), "allocated"); got != "10Gi" {
		t.Errorf("allocated %s, want 10Gi (the shared claim once)", got)
	}
	w.schedule()
	w.cycle()
	if got := mem(w.status("team-a"), "allocated"); got != "10Gi" {
		t.Errorf("allocated %s after scheduling, want 10Gi", got)
	}
	if w.get("a").Spec.NodeName != "n1" || w.get("b").Spec.NodeName != "n1" {
		t.Error("pods sharing a claim were not scheduled")
	}
}

func TestRestartRebuildsAccounting(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:1"})
	w.queue(Queue("team-a", "", "", ""))
	w.template(Template("ns", "share", Request{Memory: "30Gi"}))
	w.pod("p1", PodOptions{Queue: "team-a", Templates: []string{"share"}})
	w.pod("p2", PodOptions{Queue: "team-a", Templates: []string{"share"}})
	w.cycle()
	expectAdmitted(t, w, "p1", "p2")
	// The scheduler has not allocated yet; the controller restarts.
	w.restart(cfg())
	w.pod("p3", PodOptions{Queue: "team-a", Templates: []string{"share"}})
	w.cycle()
	expectAdmitted(t, w)
	expectVerdict(t, w, "p3", decide.ReasonDoesNotFit, "pod p3: its claims fit on no node now")
	if got := mem(w.status("team-a"), "allocated"); got != "60Gi" {
		t.Errorf("allocated %s after restart, want 60Gi", got)
	}
	w.schedule()
	w.restart(cfg())
	w.cycle()
	if got := mem(w.status("team-a"), "allocated"); got != "60Gi" {
		t.Errorf("allocated %s after scheduling and restart, want 60Gi", got)
	}
	expectAdmitted(t, w)
}

func TestReclaim(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:4"})
	// team-a is guaranteed three GPUs' memory, team-b one (80Gi, a bit more
	// than one H100's usable 79.4Gi); team-b takes all four while team-a
	// is idle.
	w.queue(Queue("team-a", "", "240Gi", ""))
	w.queue(Queue("team-b", "", "80Gi", ""))
	w.template(Template("ns", "gpu", Request{}))
	for _, n := range names("b-%d", 4) {
		w.pod(n, PodOptions{Queue: "team-b", Templates: []string{"gpu"}})
	}
	w.cycle()
	expectAdmitted(t, w, "b-0", "b-1", "b-2", "b-3")
	w.schedule()
	w.pod("a-0", PodOptions{Queue: "team-a", Templates: []string{"gpu"}})
	w.cycle()
	// The most recent over-quota workload goes; one is enough.
	if got := w.evictedNames(); !reflect.DeepEqual(got, []string{"b-3"}) {
		t.Fatalf("evicted %v, want [b-3]; %s", got, waiting(w))
	}
	expectAdmitted(t, w)
	expectVerdict(t, w, "a-0", decide.ReasonReclaiming, "evicting pod b-3 (queue team-b)")
	// While b-3 terminates a-0 waits and nothing more is evicted.
	w.cycle()
	if len(w.last.Evict) != 0 {
		t.Fatalf("evicted again: %v", w.evictedNames())
	}
	expectAdmitted(t, w)
	expectVerdict(t, w, "a-0", decide.ReasonReclaiming, "waiting for evicted workloads to end")
	w.remove("b-3")
	w.cycle()
	expectAdmitted(t, w, "a-0")
	w.schedule()
	if w.get("a-0").Spec.NodeName != "n1" {
		t.Fatal("a-0 not scheduled")
	}
	// Two more team-a pods: b-2 may go (team-b keeps 2 GPUs, above its
	// quota); b-1 may not (team-b would hold 79.4Gi, below its 80Gi).
	w.pod("a-1", PodOptions{Queue: "team-a", Templates: []string{"gpu"}})
	w.pod("a-2", PodOptions{Queue: "team-a", Templates: []string{"gpu"}})
	w.cycle()
	if got := w.evictedNames(); !reflect.DeepEqual(got, []string{"b-2"}) {
		t.Fatalf("evicted %v, want [b-2]; %s", got, waiting(w))
	}
	expectVerdict(t, w, "a-2", decide.ReasonDoesNotFit, "pod a-2: its claims fit on no node now")
	w.remove("b-2")
	w.cycle()
	expectAdmitted(t, w, "a-1")
	if len(w.last.Evict) != 0 {
		t.Fatalf("evicted below quota: %v", w.evictedNames())
	}
	w.schedule()
	w.cycle()
	expectAdmitted(t, w)
	if len(w.last.Evict) != 0 {
		t.Fatalf("evicted below quota: %v", w.evictedNames())
	}
	expectVerdict(t, w, "a-2", decide.ReasonDoesNotFit, "pod a-2: its claims fit on no node now")
}

// Reclaim's messages never name another namespace's workloads: the
// preemptor's condition counts its victims' queues, the victims' eviction
// message does not name the preemptor, and over-quota work held back is
// told only that capacity is held.
func TestReclaimMessagesStayInTheirNamespace(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:2"})
	w.queue(Queue("team-a", "", "160Gi", ""))
	w.queue(Queue("team-b", "", "0", ""))
	for _, ns := range []string{"a", "b"} {
		w.template(Template(ns, "gpu", Request{}))
	}
	w.podIn("b", "secret-b-0", PodOptions{Queue: "team-b", Templates: []string{"gpu"}})
	w.podIn("b", "secret-b-1", PodOptions{Queue: "team-b", Templates: []string{"gpu"}})
	w.cycle()
	expectAdmitted(t, w, "secret-b-0", "secret-b-1")
	w.schedule()
	w.podIn("a", "secret-a-0", PodOptions{Queue: "team-a", Templates: []string{"gpu"}})
	w.podIn("b", "secret-b-2", PodOptions{Queue: "team-b", Templates: []string{"gpu"}})
	w.cycle()
	if len(w.last.Evict) != 1 {
		t.Fatalf("evicted %v, want one team-b pod", w.evictedNames())
	}
	if msg := w.last.Evict[0].Message; strings.Contains(msg, "secret-a") || !strings.Contains(msg, "a workload of another namespace") {
		t.Errorf("victim's message %q names the preemptor", msg)
	}
	expectVerdict(t, w, "secret-a-0", decide.ReasonReclaiming, "evicting a workload of another namespace (queue team-b)")
	for _, v := range w.last.Waiting {
		if v.Workload.Namespace == "b" && strings.Contains(v.Message, "secret-a") {
			t.Errorf("%s's message %q names another namespace's pod", v.Workload.Key, v.Message)
		}
	}
}

func TestReclaimOff(t *testing.T) {
	c := cfg()
	c.Reclaim = false
	w := newWorld(t, c)
	w.node("n1", NodeOptions{Profile: "h100-80gb:1"})
	w.queue(Queue("team-a", "", "80Gi", ""))
	w.queue(Queue("team-b", "", "", ""))
	w.template(Template("ns", "gpu", Request{}))
	w.pod("b-0", PodOptions{Queue: "team-b", Templates: []string{"gpu"}})
	w.cycle()
	w.schedule()
	w.pod("a-0", PodOptions{Queue: "team-a", Templates: []string{"gpu"}})
	w.cycle()
	if len(w.last.Evict) != 0 {
		t.Fatal("evicted with reclaim off")
	}
}

func TestFairShareOrder(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:4"})
	w.queue(Queue("a", "", "", ""))
	w.queue(Queue("b", "", "", ""))
	w.template(Template("ns", "gpu", Request{}))
	// Queue a submits first, but the four GPUs are split two and two.
	for _, n := range names("a-%d", 4) {
		w.pod(n, PodOptions{Queue: "a", Templates: []string{"gpu"}})
	}
	for _, n := range names("b-%d", 4) {
		w.pod(n, PodOptions{Queue: "b", Templates: []string{"gpu"}})
	}
	w.cycle()
	expectAdmitted(t, w, "a-0", "a-1", "b-0", "b-1")
	if mem(w.status("a"), "fair") != mem(w.status("b"), "fair") {
		t.Errorf("fair shares differ: %s vs %s", mem(w.status("a"), "fair"), mem(w.status("b"), "fair"))
	}
}

func TestOverQuotaHeldForReclaim(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:2"})
	w.queue(Queue("team-a", "", "200Gi", ""))
	w.queue(Queue("team-b", "", "", ""))
	w.queue(Queue("team-c", "", "", ""))
	w.template(Template("ns", "gpu", Request{}))
	w.template(Template("ns", "two", Request{Count: 2}))
	w.pod("b-0", PodOptions{Queue: "team-b", Templates: []string{"gpu"}})
	w.cycle()
	w.schedule()
	// team-a needs both GPUs: b-0 is evicted; team-c's over-quota pod must
	// not take the GPU that is left meanwhile.
	w.pod("a-0", PodOptions{Queue: "team-a", Templates: []string{"two"}})
	w.pod("c-0", PodOptions{Queue: "team-c", Templates: []string{"gpu"}})
	w.cycle()
	if got := w.evictedNames(); !reflect.DeepEqual(got, []string{"b-0"}) {
		t.Fatalf("evicted %v; %s", got, waiting(w))
	}
	expectAdmitted(t, w)
	expectVerdict(t, w, "c-0", decide.ReasonOverQuotaHeld, "idle capacity is held for pod a-0 in queue team-a")
}

func TestQueueStatusHierarchy(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:1"})
	w.queue(Queue("org", "", "40Gi", ""))
	w.queue(Queue("x", "org", "20Gi", ""))
	w.queue(Queue("y", "org", "20Gi", ""))
	w.template(Template("ns", "s", Request{Memory: "10Gi"}))
	w.pod("x-0", PodOptions{Queue: "x", Templates: []string{"s"}})
	w.pod("y-0", PodOptions{Queue: "y", Templates: []string{"s"}})
	w.pod("y-1", PodOptions{Queue: "y", Templates: []string{"s"}})
	w.cycle()
	expectAdmitted(t, w, "x-0", "y-0", "y-1")
	org := w.status("org")
	if mem(org, "allocated") != "30Gi" || org.AdmittedWorkloads != 3 {
		t.Errorf("org status: %+v", org)
	}
	if q := w.status("y").Allocated[v1alpha1.ResourceGPUs]; q.MilliValue() == 0 {
		t.Error("no GPU equivalents charged")
	}
}

func TestGangJoinsRunningGang(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:4"})
	w.queue(Queue("q", "", "", ""))
	w.template(Template("ns", "gpu", Request{}))
	w.pod("g-0", PodOptions{Queue: "q", Gang: "g", GangSize: "2", Templates: []string{"gpu"}})
	w.pod("g-1", PodOptions{Queue: "q", Gang: "g", GangSize: "2", Templates: []string{"gpu"}})
	w.cycle()
	expectAdmitted(t, w, "g-0", "g-1")
	w.schedule()
	w.pod("g-2", PodOptions{Queue: "q", Gang: "g", GangSize: "2", Templates: []string{"gpu"}})
	w.cycle()
	expectAdmitted(t, w, "g-2")
}
