package decide_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/control/decide"
	. "github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
)

func TestGraceSeconds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		own   *int64
		bound time.Duration
		want  *int64
	}{
		{"long own grace is cut to the bound", ptr.To[int64](600), 30 * time.Second, ptr.To[int64](30)},
		{"shorter own grace is kept", ptr.To[int64](10), 30 * time.Second, ptr.To[int64](10)},
		{"unset own grace is the API's default, 30 s", nil, time.Minute, ptr.To[int64](30)},
		{"unset own grace under a shorter bound", nil, 5 * time.Second, ptr.To[int64](5)},
		{"zero own grace becomes 1 s (0 would drop the pod before it stops)", ptr.To[int64](0), 30 * time.Second, ptr.To[int64](1)},
		{"a bound under a second is 1 s", ptr.To[int64](600), 500 * time.Millisecond, ptr.To[int64](1)},
		{"no bound: the pod's own", ptr.To[int64](600), 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &corev1.Pod{Spec: corev1.PodSpec{TerminationGracePeriodSeconds: tc.own}}
			if got := decide.GraceSeconds(p, tc.bound); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("GraceSeconds = %v, want %v", ptr.Deref(got, -1), ptr.Deref(tc.want, -1))
			}
		})
	}
}

// reclaimWorld: one node of two H100s; team-b (no quota) runs b-0 and then
// b-1, 60Gi shares, one per GPU, so about 19Gi stay idle on each; team-a
// is guaranteed a GPU and needs a whole one, which only reclaim frees;
// team-c (no quota) may borrow the idle memory (s2: a 2Gi share).
func reclaimWorld(t *testing.T, c decide.Config) *world {
	t.Helper()
	w := newWorld(t, c)
	w.node("n1", NodeOptions{Profile: "h100-80gb:2"})
	w.queue(Queue("team-a", "", "80Gi", ""))
	w.queue(Queue("team-b", "", "", ""))
	w.queue(Queue("team-c", "", "", ""))
	w.template(Template("ns", "gpu", Request{}))
	w.template(Template("ns", "two", Request{Count: 2}))
	w.template(Template("ns", "s2", Request{Memory: "2Gi"}))
	w.template(Template("ns", "s60", Request{Memory: "60Gi"}))
	for _, n := range []string{"b-0", "b-1"} {
		p := w.pod(n, PodOptions{Queue: "team-b", Templates: []string{"s60"}})
		p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](600)
		w.cycle()
		w.schedule()
	}
	return w
}

// A victim's own 600 s grace period does not hold the reclaim: the
// eviction asks for the bound (30 s by default).
func TestReclaimBoundsTheGracePeriod(t *testing.T) {
	w := reclaimWorld(t, cfg())
	w.pod("a-0", PodOptions{Queue: "team-a", Templates: []string{"gpu"}})
	w.cycle()
	if got := w.evictedNames(); !reflect.DeepEqual(got, []string{"b-1"}) {
		t.Fatalf("evicted %v, want [b-1]; %s", got, waiting(w))
	}
	e := w.last.Evict[0]
	if e.GracePeriod != decide.DefaultReclaimGracePeriod || e.For == nil || e.For.Name != "a-0" {
		t.Errorf("eviction: grace period %s, for %v; want %s, for a-0", e.GracePeriod, e.For, decide.DefaultReclaimGracePeriod)
	}
	b1 := w.get("b-1")
	if g := ptr.Deref(b1.DeletionGracePeriodSeconds, -1); g != 30 {
		t.Errorf("b-1 deleted with a grace period of %d s, want 30 (its own is 600)", g)
	}
	if !strings.Contains(e.Message, "grace period at most 30s") {
		t.Errorf("victim's message %q does not say the grace period", e.Message)
	}
	w.cycle()
	expectVerdict(t, w, "a-0", decide.ReasonReclaiming, "waiting for evicted workloads to end: pod b-1 (queue team-b), due to end by "+b1.DeletionTimestamp.UTC().Format(time.RFC3339))
	// b-1 is stuck (its node is lost): long past its deadline it is no
	// longer waited for, and reclaim takes another victim.
	w.clock = b1.DeletionTimestamp.Add(3 * time.Minute)
	w.cycle()
	if got := w.evictedNames(); !reflect.DeepEqual(got, []string{"b-0"}) {
		t.Fatalf("with b-1 stuck, evicted %v, want [b-0]; %s", got, waiting(w))
	}
}

// A tenant that deletes its own over-quota pod with a long grace period
// does not hold the reclaim either: reclaim evicts it again, which cuts
// the grace period. A queue within its quota keeps its own, and reclaim
// does not wait (holding idle capacity) for it.
func TestReclaimAndLongGraceDeletes(t *testing.T) {
	w := reclaimWorld(t, cfg())
	now := w.tick()
	w.deleteWith(w.get("b-1"), 600, now)
	w.pod("a-0", PodOptions{Queue: "team-a", Templates: []string{"gpu"}})
	w.cycle()
	if got := w.evictedNames(); !reflect.DeepEqual(got, []string{"b-1"}) {
		t.Fatalf("evicted %v, want b-1's grace period cut; %s", got, waiting(w))
	}
	if !strings.Contains(w.last.Evict[0].Message, "grace period cut to at most 30s") {
		t.Errorf("message %q", w.last.Evict[0].Message)
	}
	b1 := w.get("b-1")
	if want := now.Add(30 * time.Second); !b1.DeletionTimestamp.Equal(&metav1.Time{Time: want}) {
		t.Errorf("b-1 now ends by %s, want %s (its deletion's start plus 30 s)", b1.DeletionTimestamp, want)
	}
	expectVerdict(t, w, "a-0", decide.ReasonReclaiming, "waiting for evicted workloads to end")
	w.cycle()
	if len(w.last.Evict) != 0 {
		t.Errorf("evicted again: %v", w.evictedNames())
	}

	// A queue within its quota deletes its own pod with a 600 s grace
	// period: reclaim does not cut it, nor wait for it: the within-quota
	// workload does not fit meanwhile, and holds nothing, so team-c's
	// over-quota share takes the memory team-y leaves idle.
	w2 := newWorld(t, cfg())
	w2.node("n1", NodeOptions{Profile: "h100-80gb:2"})
	w2.queue(Queue("team-a", "", "80Gi", ""))
	w2.queue(Queue("team-b", "", "80Gi", ""))
	w2.queue(Queue("team-y", "", "80Gi", ""))
	w2.queue(Queue("team-c", "", "", ""))
	w2.template(Template("ns", "gpu", Request{}))
	w2.template(Template("ns", "s60", Request{Memory: "60Gi"}))
	w2.template(Template("ns", "s2", Request{Memory: "2Gi"}))
	w2.pod("b-0", PodOptions{Queue: "team-b", Templates: []string{"gpu"}})
	w2.pod("y-0", PodOptions{Queue: "team-y", Templates: []string{"s60"}})
	w2.cycle()
	w2.schedule()
	w2.deleteWith(w2.get("b-0"), 600, w2.tick())
	w2.pod("a-0", PodOptions{Queue: "team-a", Templates: []string{"gpu"}})
	w2.pod("c-0", PodOptions{Queue: "team-c", Templates: []string{"s2"}})
	w2.cycle()
	if len(w2.last.Evict) != 0 {
		t.Errorf("cut the grace period of a queue within its quota: %v", w2.evictedNames())
	}
	expectVerdict(t, w2, "a-0", decide.ReasonDoesNotFit, "its claims fit on no node now")
	expectAdmitted(t, w2, "c-0")
}

// An eviction a budget refuses is passed over for another victim that
// makes room; over-quota work waits only while the reclaim proceeds.
func TestReclaimPassesOverARefusedVictim(t *testing.T) {
	w := reclaimWorld(t, cfg())
	w.budgets["b-1"] = true
	w.pod("a-0", PodOptions{Queue: "team-a", Templates: []string{"gpu"}})
	w.cycle()
	if got := w.evictedNames(); !reflect.DeepEqual(got, []string{"b-1"}) {
		t.Fatalf("evicted %v, want [b-1] (the most recent) first", got)
	}
	if w.get("b-1").DeletionTimestamp != nil {
		t.Fatal("b-1's budget did not refuse")
	}
	w.cycle()
	if got := w.evictedNames(); !reflect.DeepEqual(got, []string{"b-0"}) {
		t.Fatalf("after b-1's budget refused, evicted %v, want [b-0]; %s", got, waiting(w))
	}
	if w.last.Evict[0].Force {
		t.Error("b-0 forced although no budget refused it")
	}
	w.remove("b-0")
	w.cycle()
	expectAdmitted(t, w, "a-0")
	if w.forced != 0 {
		t.Errorf("%d pods deleted past their budget, want none: b-0 made room", w.forced)
	}
}

// When only budget-protected victims make room, reclaim takes them past
// their budget (Config.ReclaimPastBudgets, the default): the within-quota
// workload is not held hostage.
func TestReclaimPastABudget(t *testing.T) {
	w := reclaimWorld(t, cfg())
	w.budgets["b-0"], w.budgets["b-1"] = true, true
	w.pod("a-0", PodOptions{Queue: "team-a", Templates: []string{"gpu"}})
	w.cycle() // b-1 refused
	w.cycle() // b-0 refused: no victim without a budget is left
	if w.get("b-0").DeletionTimestamp != nil || w.get("b-1").DeletionTimestamp != nil {
		t.Fatalf("a budget did not refuse: %s", waiting(w))
	}
	w.cycle()
	if len(w.last.Evict) != 1 || !w.last.Evict[0].Force {
		t.Fatalf("evictions %v, want one forced past its budget; %s", w.evictedNames(), waiting(w))
	}
	if w.forced != 1 {
		t.Fatalf("%d pods deleted past their budget, want 1", w.forced)
	}
	expectVerdict(t, w, "a-0", decide.ReasonReclaiming, "past its disruption budget")
	w.remove(w.last.Evict[0].Pods[0].Name)
	w.cycle()
	expectAdmitted(t, w, "a-0")
}

// A reclaim that cannot proceed holds nothing: with budgets honoured
// (ReclaimPastBudgets off), or an eviction refused outright (an admission
// webhook), the within-quota workload waits and says why, and another
// queue's over-quota work takes the idle capacity meanwhile. Once the
// refusal is old, the eviction is tried again.
func TestRefusedReclaimHoldsNothing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     func(*decide.Config)
		protect func(*world)
		by      string
	}{
		{"budgets honoured", func(c *decide.Config) { c.ReclaimPastBudgets = false },
			func(w *world) { w.budgets["b-0"], w.budgets["b-1"] = true, true }, "by a disruption budget"},
		{"refused by a webhook", func(*decide.Config) {},
			func(w *world) { w.refuse["b-0"], w.refuse["b-1"] = true, true }, "by the API server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg()
			tc.cfg(&c)
			w := reclaimWorld(t, c)
			tc.protect(w)
			// a-0 (namespace a) needs a GPU; neither victim can go. c-0
			// (team-c, over its quota) fits the idle memory of either GPU.
			w.template(Template("a", "gpu", Request{}))
			w.podIn("a", "a-0", PodOptions{Queue: "team-a", Templates: []string{"gpu"}})
			w.pod("c-0", PodOptions{Queue: "team-c", Templates: []string{"s2"}})
			w.cycle() // evicts b-1: refused; c-0 waits while the reclaim may proceed
			expectVerdict(t, w, "c-0", decide.ReasonOverQuotaHeld, "idle capacity is held")
			w.cycle() // b-1 passed over, evicts b-0: refused
			if got := w.evictedNames(); !reflect.DeepEqual(got, []string{"b-0"}) {
				t.Fatalf("second cycle evicted %v, want [b-0]; %s", got, waiting(w))
			}
			if w.get("b-0").DeletionTimestamp != nil || w.get("b-1").DeletionTimestamp != nil {
				t.Fatalf("an eviction went through: %s", waiting(w))
			}
			w.cycle()
			if len(w.last.Evict) != 0 {
				t.Fatalf("evicted %v although every eviction was refused", w.evictedNames())
			}
			expectVerdict(t, w, "a-0", decide.ReasonDoesNotFit, "reclaim passes over over-quota workloads whose eviction was refused")
			expectVerdict(t, w, "a-0", decide.ReasonDoesNotFit, tc.by)
			expectVerdict(t, w, "a-0", decide.ReasonDoesNotFit, "nothing is held for this workload meanwhile")
			if v := w.verdict("a-0"); strings.Contains(v.Message, "b-0") || strings.Contains(v.Message, "b-1") {
				t.Errorf("a-0's message names another namespace's pods: %q", v.Message)
			}
			// Nothing is held for a-0, whose reclaim cannot proceed: c-0
			// takes the idle memory.
			expectAdmitted(t, w, "c-0")
		})
	}
}

// The refusal is remembered for a while only: after that the eviction is
// tried again.
func TestRefusedEvictionTriedAgain(t *testing.T) {
	w := reclaimWorld(t, cfg())
	w.refuse["b-0"], w.refuse["b-1"] = true, true
	w.pod("a-0", PodOptions{Queue: "team-a", Templates: []string{"gpu"}})
	w.cycle()
	w.cycle()
	w.cycle()
	if len(w.last.Evict) != 0 {
		t.Fatalf("evicted %v while refusals are fresh", w.evictedNames())
	}
	w.clock = w.clock.Add(refusalTTL + time.Second)
	delete(w.refuse, "b-0")
	delete(w.refuse, "b-1")
	w.cycle()
	if got := w.evictedNames(); !reflect.DeepEqual(got, []string{"b-1"}) {
		t.Fatalf("after the refusals aged, evicted %v, want [b-1] again", got)
	}
}

// A victim whose pods stopped is no workload any more, but its claim stays
// allocated until the resourceclaim controller releases it: in that
// moment reclaim waits for it rather than taking one more victim.
func TestReclaimWaitsForTheDevicesOfEndedPods(t *testing.T) {
	w := reclaimWorld(t, cfg())
	w.pod("a-0", PodOptions{Queue: "team-a", Templates: []string{"gpu"}})
	w.cycle()
	if got := w.evictedNames(); !reflect.DeepEqual(got, []string{"b-1"}) {
		t.Fatalf("evicted %v, want [b-1]", got)
	}
	w.stop("b-1")
	w.cycle()
	if len(w.last.Evict) != 0 {
		t.Fatalf("evicted %v while b-1's claim is being released", w.evictedNames())
	}
	expectVerdict(t, w, "a-0", decide.ReasonReclaiming, "waiting for evicted workloads to end: the devices of pods that ended, being released")
	w.release()
	w.cycle()
	expectAdmitted(t, w, "a-0")
}
