package decide_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/control/decide"
	. "github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
)

// A pod that asks for a GPU through an extended resource, without
// spec.resourceClaims, goes through its queue like a claim pod: its demand
// is the claim kube-scheduler will make for it, a queue whose limit is 0
// does not admit it, and once the scheduler made and allocated the claim
// it is charged from the allocation, once.
func TestExtendedResourceThroughQueue(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:2"})
	w.queue(Queue("zero", "", "0", "0"))
	w.queue(Queue("team", "", "", "100Gi"))
	w.template(Template("ns", "s1", Request{Memory: "1Gi"}))
	ext := map[string]string{ImplicitGPU: "1"}

	w.pod("free-ride", PodOptions{Queue: "zero", Extended: ext})
	w.cycle()
	expectAdmitted(t, w)
	expectVerdict(t, w, "free-ride", decide.ReasonQueueLimit, "queue zero: needs ")

	w.pod("whole", PodOptions{Queue: "team", Extended: ext})
	w.cycle()
	expectAdmitted(t, w, "whole")
	whole := mem(w.status("team"), "allocated")
	if whole == "0" || whole == "" {
		t.Fatalf("a whole GPU through an extended resource charged %q", whole)
	}
	w.schedule()
	p := w.get("whole")
	if p.Spec.NodeName == "" || p.Status.ExtendedResourceClaimStatus == nil {
		t.Fatalf("the scheduler did not place the pod with the claim it made: node %q", p.Spec.NodeName)
	}
	w.cycle()
	if got := mem(w.status("team"), "allocated"); got != whole {
		t.Errorf("charged %s from the allocation, %s before it: the claim counted twice or not at all", got, whole)
	}

	// A share claim and an extended resource in one pod: both are demand.
	w.pod("both", PodOptions{Queue: "zero", Templates: []string{"s1"}, Extended: ext})
	w.cycle()
	expectVerdict(t, w, "both", decide.ReasonQueueLimit, "queue zero: needs ")
}

// A class's own extendedResourceName (here nvidia.com/gpu, what pods
// written for the device plugin ask) resolves like the implicit name; a
// node where a device plugin serves that name hands it out outside any
// claim, so the pod is never placed there.
func TestExtendedResourceNameAndDevicePluginNodes(t *testing.T) {
	w := newWorld(t, cfg())
	dp := Classes()[0].DeepCopy()
	if dp.Name != "gpu.tessera.dev" {
		t.Fatalf("Classes()[0] is %s", dp.Name)
	}
	dp.Spec.ExtendedResourceName = ptr.To("nvidia.com/gpu")
	w.snap.Classes[0] = dp
	w.node("a-plugin", NodeOptions{Profile: "h100-80gb:2"})
	w.node("b-dra", NodeOptions{Profile: "h100-80gb:1"})
	w.snap.Nodes[0].Status.Allocatable = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("2")}
	w.queue(Queue("team", "", "", ""))
	for _, n := range []string{"x1", "x2"} {
		w.pod(n, PodOptions{Queue: "team", Extended: map[string]string{"nvidia.com/gpu": "1"}})
	}
	w.cycle()
	expectAdmitted(t, w, "x1")
	if n := w.last.Admit[0].Nodes[w.get("x1").UID]; n != "b-dra" {
		t.Errorf("placed on %s, want b-dra (a-plugin serves nvidia.com/gpu through its device plugin)", n)
	}
	expectVerdict(t, w, "x2", decide.ReasonDoesNotFit, "fit on no node")
	if got := w.status("team").AdmittedWorkloads; got != 1 {
		t.Errorf("admitted workloads %d", got)
	}
}

// Members of a gang that ask through extended resources are admitted all
// or nothing, like claim pods.
func TestExtendedResourceGang(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:2"})
	w.queue(Queue("team", "", "", ""))
	ext := map[string]string{ImplicitGPU: "1"}
	for _, n := range names("g-%d", 3) {
		w.pod(n, PodOptions{Queue: "team", Gang: "g", GangSize: "3", Extended: ext})
	}
	w.cycle()
	expectAdmitted(t, w)
	expectVerdict(t, w, "g-0", decide.ReasonDoesNotFit, "gang g: 2 of 3 members' claims fit")
}

// The queue rules are the queue's at admission, not at the pod's
// creation: a queue created after the pod that names it, for other
// namespaces only, does not admit it; a selector narrowed while a pod
// waits stops its admission (what runs keeps running, charged); a
// namespace relabelled to match admits it.
func TestQueueRulesAtAdmission(t *testing.T) {
	w := newWorld(t, cfg())
	w.node("n1", NodeOptions{Profile: "h100-80gb:4"})
	w.namespace("ns", map[string]string{"team": "b"})
	w.template(Template("ns", "gpu", Request{}))
	w.pod("early", PodOptions{Queue: "late", Templates: []string{"gpu"}})
	w.cycle()
	expectVerdict(t, w, "early", decide.ReasonInvalid, "queue late does not exist")

	late := Queue("late", "", "", "")
	late.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
	w.queue(late)
	w.cycle()
	expectAdmitted(t, w)
	expectVerdict(t, w, "early", decide.ReasonNamespaceNotSelected, `queue late takes pods only from namespaces matching its namespaceSelector "team=a"; namespace ns does not match`)

	w.namespace("ns", map[string]string{"team": "a"})
	w.cycle()
	expectAdmitted(t, w, "early")
	w.schedule()

	// Narrowed while a second pod waits: it waits; the running one stays.
	w.pod("second", PodOptions{Queue: "late", Templates: []string{"gpu"}})
	late.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "c"}}
	w.cycle()
	expectAdmitted(t, w)
	expectVerdict(t, w, "second", decide.ReasonNamespaceNotSelected, `namespaceSelector "team=c"`)
	if len(w.last.Evict) > 0 || w.status("late").AdmittedWorkloads != 1 {
		t.Errorf("a narrowed selector evicted or uncharged running work: evict %v, admitted %d", w.evictedNames(), w.status("late").AdmittedWorkloads)
	}

	// A namespace the controller does not know yet is not taken.
	w.podIn("unknown", "stranger", PodOptions{Queue: "late", Templates: []string{"gpu"}})
	w.cycle()
	expectVerdict(t, w, "stranger", decide.ReasonNamespaceNotSelected, "namespace unknown is not known to the controller yet")

	// An invalid selector refuses everyone, with the fix.
	late.Spec.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: "Bogus"}}}
	w.cycle()
	expectVerdict(t, w, "second", decide.ReasonNamespaceNotSelected, "invalid spec.namespaceSelector")
}
