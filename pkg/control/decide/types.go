package decide

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/queue"
	"github.com/tessera-dev/tessera/pkg/control/sliceintern"
)

// Reasons of verdicts, used as event and condition reasons.
const (
	ReasonAdmitted        = "Admitted"
	ReasonInvalid         = "InvalidWorkload"
	ReasonGangIncomplete  = "GangIncomplete"
	ReasonWaitingClaims   = "WaitingForClaims"
	ReasonQueueLimit      = "QueueLimit"
	ReasonDoesNotFit      = "DoesNotFit"
	ReasonOverQuotaHeld   = "OverQuotaHeld"
	ReasonReclaiming      = "Reclaiming"
	ReasonReclaimed       = "Reclaimed"
	ReasonNoDeviceMatches = "NoDeviceMatches"
)

// Config tunes the decisions.
type Config struct {
	// Reclaim evicts over-quota workloads of other queues for a workload
	// within quota that does not fit otherwise.
	Reclaim bool
	// MaxReclaimsPerCycle bounds the workloads one cycle tries to reclaim
	// for (each try simulates the workload against the cluster without
	// candidate victims); the others wait for a later cycle. 0 means the
	// default, 16.
	MaxReclaimsPerCycle int
	// Features are the allocator features of the cluster's scheduler.
	Features structured.Features
	// ExactPlacement gives the allocator every device of a node and tries
	// every claim on every node, without the shortcuts that make placement
	// with selective devices (MIG, prioritized lists) fast: selector
	// results cached per device content, the allocator given only the
	// devices a claim can select plus the allocated ones, and failures
	// shared between claims where one implies the other. The decisions
	// are the same either way (tests compare them); it is there for those
	// tests and for debugging.
	ExactPlacement bool
	// TaintRules lists the DeviceTaintRules for cycles whose snapshot has
	// none (Snapshot.TaintRules nil); nil lists none.
	TaintRules TaintRuleLister
	// ReclaimGracePeriod bounds the grace period of a reclaimed pod: its
	// eviction asks for the pod's own terminationGracePeriodSeconds or
	// this, whichever is shorter, and a victim already terminating with a
	// later deadline is evicted again to cut it. 0 means the default,
	// DefaultReclaimGracePeriod.
	ReclaimGracePeriod time.Duration
	// ReclaimPastBudgets lets reclaim delete over-quota victims whose
	// eviction a PodDisruptionBudget refused, when no other over-quota
	// workloads make room (Eviction.Force). Off: budgets are honoured and
	// the reclaim waits, without holding idle capacity.
	ReclaimPastBudgets bool
}

// DefaultReclaimGracePeriod is Config.ReclaimGracePeriod's default.
const DefaultReclaimGracePeriod = 30 * time.Second

// DefaultConfig is what the controller runs with unless told otherwise.
func DefaultConfig() Config {
	return Config{Reclaim: true, MaxReclaimsPerCycle: 16, Features: allocation.SchedulerFeatures,
		ReclaimGracePeriod: DefaultReclaimGracePeriod, ReclaimPastBudgets: true}
}

// reclaimGrace is the bound on a reclaimed pod's grace period.
func (c Config) reclaimGrace() time.Duration {
	if c.ReclaimGracePeriod <= 0 {
		return DefaultReclaimGracePeriod
	}
	return c.ReclaimGracePeriod
}

// Snapshot is the state of the API one cycle decides on. Objects are read,
// never modified.
type Snapshot struct {
	Queues    []*v1alpha1.Queue
	Pods      []*corev1.Pod
	Claims    []*resourceapi.ResourceClaim
	Templates []*resourceapi.ResourceClaimTemplate
	Slices    []*resourceapi.ResourceSlice
	Classes   []*resourceapi.DeviceClass
	Nodes     []*corev1.Node
	// Attributes reads the devices' attributes where the slices come from
	// the controller's cache, which keeps them in a compact form
	// (sliceintern); nil: the slices carry them.
	Attributes *sliceintern.Interner
	// Namespaces are the cluster's namespaces: a queue's namespaceSelector
	// is matched against their labels when a pod is admitted (rules.go),
	// and the claims that unqueued pods of a namespace labelled with a
	// queue (a managed namespace) hold are charged to it (charges.go).
	Namespaces []*corev1.Namespace
	// TaintRules are the DeviceTaintRules, applied to the slices as the
	// scheduler applies them (taintrules.go); nil: Config.TaintRules.
	TaintRules []*resourceapi.DeviceTaintRule
	// Refused are the pods whose eviction for reclaim the API refused
	// lately, by UID (the controller remembers them for a while): reclaim
	// passes them over for other victims (reclaim.go).
	Refused map[types.UID]Refusal
	// Now is the time of the snapshot; zero means time.Now().
	Now time.Time
}

// Refusal is an eviction the API refused.
type Refusal struct {
	// At is when it was refused.
	At time.Time
	// Budget says that a PodDisruptionBudget refused it (HTTP 429);
	// otherwise something else did (an admission webhook or policy, RBAC,
	// an error), and nothing gets past it.
	Budget bool
}

// Admission is a workload to start: remove the gate from every pod.
type Admission struct {
	Workload *Workload
	Pods     []*corev1.Pod
	// Nodes is where the simulation placed each pod's claims.
	Nodes   map[types.UID]string
	Charge  queue.Vector
	Message string
	// Holds is what each pod's claims were charged at admission, every
	// claim counted whole (v1alpha1.AdmittedChargeAnnotation).
	Holds map[types.UID]queue.Vector
}

// Verdict says why a workload waits.
type Verdict struct {
	Workload *Workload
	Reason   string
	Message  string
	// Invalid marks bad input: the workload is not admitted as it is.
	Invalid bool
	// Fault classifies bad input (one of Faults) when Invalid.
	Fault string
}

// Eviction is an admitted workload to evict (all its pods).
type Eviction struct {
	Workload *Workload
	Pods     []*corev1.Pod
	// Reason is ReasonReclaimed, or ReasonOverLimit (charges.go).
	Reason  string
	Message string
	// For is the workload a reclaim evicts it for; nil otherwise.
	For *Workload
	// GracePeriod bounds each pod's grace period (GraceSeconds); 0: the
	// pod's own.
	GracePeriod time.Duration
	// Force: a PodDisruptionBudget refused this workload's eviction
	// before and no other over-quota workloads make room; when the
	// Eviction API refuses again, the pods are deleted (with the same
	// grace period).
	Force bool
}

// GraceSeconds is the grace period to evict p with under a bound: the
// pod's own terminationGracePeriodSeconds (the API's default, 30 s, when
// unset) or the bound, whichever is shorter, and at least 1 s (0 would
// remove the pod from the API before its containers stop). nil when there
// is no bound.
func GraceSeconds(p *corev1.Pod, bound time.Duration) *int64 {
	if bound <= 0 {
		return nil
	}
	own := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if p.Spec.TerminationGracePeriodSeconds != nil {
		own = *p.Spec.TerminationGracePeriodSeconds
	}
	s := min(own, int64(bound/time.Second))
	return ptr.To(max(s, 1))
}

// Stats describe a cycle.
type Stats struct {
	Workloads, Pending, Admitted, Waiting, Invalid, Evicted int
	AllocatorCalls                                          int
	// SharedFailures counts allocator runs skipped because another claim's
	// failure on the node implies the claim's (see ExactPlacement).
	SharedFailures int
	// CELEvaluations counts the selector evaluations of the shortcuts that
	// no earlier result for the same expression and the same device parts
	// spared; StrippedCalls the allocator calls without selectors.
	CELEvaluations, StrippedCalls int
	Duration                      time.Duration
}

// Decision is the outcome of one cycle.
type Decision struct {
	Admit   []*Admission
	Waiting []*Verdict
	Evict   []*Eviction
	// Queues is the status of every queue, by name.
	Queues map[string]*v1alpha1.QueueStatus
	Stats  Stats
}
