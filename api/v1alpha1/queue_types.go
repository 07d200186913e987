package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ResourceName names a resource the controller accounts per queue.
// +kubebuilder:validation:Enum=gpu.tessera.dev/memory;gpu.tessera.dev/gpus
type ResourceName string

// The accounted resources.
const (
	// ResourceGPUMemory is GPU memory in bytes: a share's consumed memory, a
	// whole GPU's usable memory, a time slice's or MIG device's memory.
	ResourceGPUMemory ResourceName = "gpu.tessera.dev/memory"
	// ResourceGPUs is GPU equivalents: a whole GPU is 1, a memory share
	// memory/usable, a time slice 1/N, a MIG device its compute slices over
	// the GPU's.
	ResourceGPUs ResourceName = "gpu.tessera.dev/gpus"
)

// Names on pods. They are a contract with users and tooling.
const (
	// QueueLabel puts a pod into a leaf queue; the mutating webhook gates it.
	QueueLabel = "tessera.dev/queue"
	// GangLabel groups pods of one gang (same namespace, same queue).
	GangLabel = "tessera.dev/gang"
	// GangSizeLabel is the gang's minimum number of members.
	GangSizeLabel = "tessera.dev/gang-size"
	// AdmissionGate is the scheduling gate the controller removes on admission.
	AdmissionGate = "tessera.dev/admission"
	// AdmissionCondition is the pod condition that says whether and why a
	// pod waits for admission.
	AdmissionCondition = "tessera.dev/Admission"
	// NodeAnnotation records the node the admission simulation placed the
	// pod's claims on; a restarted controller places them there again.
	NodeAnnotation = "tessera.dev/simulated-node"
	// AdmittedAtAnnotation records when the pod was admitted (RFC 3339);
	// reclaim takes the most recently admitted first.
	AdmittedAtAnnotation = "tessera.dev/admitted-at"
	// AdmittedByAnnotation records the --controller-name of the controller
	// that admitted the pod (canary queues).
	AdmittedByAnnotation = "tessera.dev/admitted-by"
	// DecisionAnnotation records, on every member of a workload of several
	// pods, the admission decision "<id>/<members>" before the first gate
	// comes off; a controller that restarts or fails between the members'
	// patches completes a fully recorded decision and rolls back one that
	// is not.
	DecisionAnnotation = "tessera.dev/admission-decision"
	// IdleCondition is the pod condition that says whether the pod is
	// idle under its queue's spec.idle (True, reason Idle, with the
	// numbers) and why it was evicted.
	IdleCondition = "tessera.dev/Idle"
	// IdleExemptLabel, "true" on a pod, exempts it from idle reclaim (a
	// gang is exempt when any member is).
	IdleExemptLabel = "tessera.dev/idle-exempt"
	// SandboxLabel, SandboxExempt on a namespace (set by a cluster
	// administrator), leaves its pods out of the chart's sandbox policy:
	// Tessera's limits no longer hold there (docs/security.md, "The
	// sandbox").
	SandboxLabel  = "tessera.dev/sandbox"
	SandboxExempt = "exempt"
)

// ResourceList is an amount per accounted resource.
type ResourceList map[ResourceName]resource.Quantity

// QueueResource bounds one accounted resource of a queue. Amounts are at
// most 1e18 (memory in bytes: an exabyte; GPUs: a quintillion), so the
// controller's 64-bit sums cannot overflow.
// +kubebuilder:validation:XValidation:rule="!has(self.quota) || !quantity(string(self.quota)).isLessThan(quantity('0'))",message="quota must not be negative"
// +kubebuilder:validation:XValidation:rule="!has(self.limit) || !quantity(string(self.limit)).isLessThan(quantity('0'))",message="limit must not be negative"
// +kubebuilder:validation:XValidation:rule="!has(self.quota) || !has(self.limit) || quantity(string(self.quota)).compareTo(quantity(string(self.limit))) <= 0",message="quota must not be above limit"
// +kubebuilder:validation:XValidation:rule="!has(self.quota) || !quantity(string(self.quota)).isGreaterThan(quantity('1e18'))",message="quota must be at most 1e18"
// +kubebuilder:validation:XValidation:rule="!has(self.limit) || !quantity(string(self.limit)).isGreaterThan(quantity('1e18'))",message="limit must be at most 1e18"
type QueueResource struct {
	// Quota is guaranteed to the queue: work within it is admitted ahead of
	// over-quota work and is never reclaimed. Unset means 0.
	// +optional
	Quota *resource.Quantity `json:"quota,omitempty"`
	// Limit is a hard cap on what the queue and its descendants may hold.
	// Unset means no cap.
	// +optional
	Limit *resource.Quantity `json:"limit,omitempty"`
	// OverQuotaWeight splits capacity beyond the quotas between sibling
	// queues of the same priority. Default 1; 0 takes no share of idle
	// capacity in the fair-share computation.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	OverQuotaWeight *int32 `json:"overQuotaWeight,omitempty"`
}

// QueueSpec defines a queue.
type QueueSpec struct {
	// Parent is the name of the parent queue; empty for a top-level queue.
	// Workloads go only to leaf queues (queues no other queue names as
	// parent).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self != ''",message="parent must not be empty; leave it out for a top-level queue"
	Parent string `json:"parent,omitempty"`
	// Priority orders sibling queues: capacity beyond the quotas goes to the
	// highest priority first, and admission serves higher priority first.
	// +optional
	Priority int32 `json:"priority,omitempty"`
	// Resources bounds the accounted resources (gpu.tessera.dev/memory,
	// gpu.tessera.dev/gpus). Quota decisions look only at the resources
	// listed. A leaf queue that lists none has quota 0 and no limit in
	// both; a parent queue that lists none only groups its children (its
	// quota for fair share is the sum of theirs, and it bounds nothing).
	// +optional
	// +kubebuilder:validation:MaxProperties=2
	// +kubebuilder:validation:XValidation:rule="self.all(k, k == 'gpu.tessera.dev/memory' || k == 'gpu.tessera.dev/gpus')",message="accounted resources are gpu.tessera.dev/memory and gpu.tessera.dev/gpus"
	Resources map[ResourceName]QueueResource `json:"resources,omitempty"`
	// NamespaceSelector says which namespaces may put pods into this
	// queue, as Kueue's ClusterQueue does: a pod whose namespace's labels
	// do not match is refused at creation. Unset selects every namespace;
	// an empty selector ({}) selects every namespace too. It is checked on
	// the queue the pod names (a parent queue's selector does not narrow
	// its children's).
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// FairSharing tunes how a parent queue divides capacity beyond its
	// children's quotas (time-based fair share). Ignored on a leaf.
	// +optional
	FairSharing *FairSharing `json:"fairSharing,omitempty"`

	// Idle, when set, reclaims what sits idle: a running pod of this leaf
	// queue whose claims used less than UsedBelow of their allocation for
	// the whole window After is marked (condition tessera.dev/Idle, an
	// event, a metric) and, with action Evict, evicted through the
	// Eviction API. Off when absent. See docs/controller.md#idle-reclaim.
	// +optional
	Idle *IdlePolicy `json:"idle,omitempty"`

	// ControllerName names the controller release that decides this
	// queue's pods (its --controller-name), for canary queues: a second
	// controller release decides the queues that name it, the main one
	// the rest. Empty means the main controller ("default"). Only a
	// top-level queue's value counts: a queue's whole tree goes to its
	// root's controller, so that the root's fair share and limits stay
	// whole; a child naming another controller is refused (condition
	// ControllerAssigned=False, reason SplitRefused) and stays with its
	// root's. See docs/safe-trials.md#canary-queues.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	ControllerName string `json:"controllerName,omitempty"`
}

// DefaultControllerName is the main controller's --controller-name: the
// one that decides queues whose tree names no controller.
const DefaultControllerName = "default"

// IdleAction is what the controller does with an idle pod.
// +kubebuilder:validation:Enum=Report;Evict
type IdleAction string

// The idle actions.
const (
	// IdleReport marks the pod (condition, event, metric) and leaves it running.
	IdleReport IdleAction = "Report"
	// IdleEvict marks the pod and evicts it (a gang whole) through the
	// Eviction API, honouring PodDisruptionBudgets.
	IdleEvict IdleAction = "Evict"
)

// IdlePolicy says when a pod of a queue counts as idle and what is done
// with it.
type IdlePolicy struct {
	// After is the window: the pod's claims must have used less than
	// UsedBelow for all of it, and usage samples must cover it all.
	// At least 1m.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Format=duration
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m')",message="after must be at least 1m"
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('8760h')",message="after must be at most 8760h (a year)"
	After metav1.Duration `json:"after"`
	// UsedBelow is the threshold, a percentage of each device's allocation
	// from 0% to 100% ("5%", "0.5%"): a device whose claim's processes hold
	// at least this fraction of its memory, or use at least this fraction
	// of its compute limit in SM time, is busy.
	// +kubebuilder:validation:MaxLength=12
	// +kubebuilder:validation:XValidation:rule="self.matches('^(100([.]0+)?|[0-9]{1,2}([.][0-9]+)?)%$')",message="usedBelow must be a percentage from 0% to 100%, such as 5% or 0.5%"
	UsedBelow string `json:"usedBelow"`
	// Action is Report (mark only; the default) or Evict (mark, then evict
	// through the Eviction API; a gang only whole).
	// +optional
	// +kubebuilder:default=Report
	Action IdleAction `json:"action,omitempty"`
}

// QueueStatus is what the controller observes and decided.
type QueueStatus struct {
	// ObservedGeneration is the spec generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Allocated is what admitted workloads of this queue and its
	// descendants hold: the real allocation for claims the scheduler has
	// allocated, the admission estimate for the others.
	// +optional
	Allocated ResourceList `json:"allocated,omitempty"`
	// Used is what the processes of those workloads' claims really use
	// (gpu.tessera.dev/memory): the sum of the usage the kubelet plugins
	// write into the claims' status.devices, which they update when a
	// claim's usage moves by max(64Mi, 5% of its share), so it lags small
	// changes. Claims not sampled yet are left out; absent when none is
	// sampled. Compare with Allocated to see what is held but idle.
	// +optional
	Used ResourceList `json:"used,omitempty"`
	// Pending is the demand of workloads waiting for admission.
	// +optional
	Pending ResourceList `json:"pending,omitempty"`
	// FairShare is the queue's share of the cluster (quota first, the rest
	// by priority and over-quota weight, capped by limit and demand).
	// +optional
	FairShare ResourceList `json:"fairShare,omitempty"`
	// AdmittedWorkloads counts admitted workloads (a gang counts once).
	// +optional
	AdmittedWorkloads int32 `json:"admittedWorkloads,omitempty"`
	// PendingWorkloads counts workloads waiting for admission.
	// +optional
	PendingWorkloads int32 `json:"pendingWorkloads,omitempty"`
	// Usage is the usage history of the queue's subtree: GPU-hours and
	// GPU memory GiB-hours, allocated and used, cumulative and decayed,
	// per namespace and GPU model. Only the controller writes it.
	// +optional
	Usage *QueueUsage `json:"usage,omitempty"`
	// Conditions: Valid says whether the queue can take workloads.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Queue is a node of the queue hierarchy. Pods name a leaf queue with the
// label tessera.dev/queue.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:validation:XValidation:rule="!has(self.spec) || !has(self.spec.parent) || self.spec.parent != self.metadata.name",message="a queue cannot be its own parent"
// +kubebuilder:resource:scope=Cluster,shortName=tq,categories=tessera
// +kubebuilder:printcolumn:name="Parent",type=string,JSONPath=`.spec.parent`
// +kubebuilder:printcolumn:name="Controller",type=string,JSONPath=`.spec.controllerName`,priority=1
// +kubebuilder:printcolumn:name="Prio",type=integer,JSONPath=`.spec.priority`,priority=1
// +kubebuilder:printcolumn:name="Mem-Quota",type=string,JSONPath=`.spec.resources.gpu\.tessera\.dev/memory.quota`
// +kubebuilder:printcolumn:name="Mem-Limit",type=string,JSONPath=`.spec.resources.gpu\.tessera\.dev/memory.limit`
// +kubebuilder:printcolumn:name="Mem-Alloc",type=string,JSONPath=`.status.allocated.gpu\.tessera\.dev/memory`
// +kubebuilder:printcolumn:name="Mem-InUse",type=string,JSONPath=`.status.used.gpu\.tessera\.dev/memory`
// +kubebuilder:printcolumn:name="Mem-Fair",type=string,JSONPath=`.status.fairShare.gpu\.tessera\.dev/memory`
// +kubebuilder:printcolumn:name="GPUs-Quota",type=string,JSONPath=`.spec.resources.gpu\.tessera\.dev/gpus.quota`,priority=1
// +kubebuilder:printcolumn:name="GPUs-Alloc",type=string,JSONPath=`.status.allocated.gpu\.tessera\.dev/gpus`
// +kubebuilder:printcolumn:name="GPUs-Fair",type=string,JSONPath=`.status.fairShare.gpu\.tessera\.dev/gpus`,priority=1
// +kubebuilder:printcolumn:name="Mem-Pending",type=string,JSONPath=`.status.pending.gpu\.tessera\.dev/memory`,priority=1
// +kubebuilder:printcolumn:name="GPUh-Alloc",type=string,JSONPath=`.status.usage.decayed.allocatedGPUHours`,priority=1,description="Decayed allocated GPU-hours"
// +kubebuilder:printcolumn:name="GPUh-Used",type=string,JSONPath=`.status.usage.decayed.usedGPUHours`,priority=1,description="Decayed used GPU-hours"
// +kubebuilder:printcolumn:name="GiBh-Alloc",type=string,JSONPath=`.status.usage.decayed.allocatedMemoryGiBHours`,priority=1,description="Decayed allocated GPU memory GiB-hours"
// +kubebuilder:printcolumn:name="GiBh-Used",type=string,JSONPath=`.status.usage.decayed.usedMemoryGiBHours`,priority=1,description="Decayed used GPU memory GiB-hours"
// +kubebuilder:printcolumn:name="Admitted",type=integer,JSONPath=`.status.admittedWorkloads`
// +kubebuilder:printcolumn:name="Pending",type=integer,JSONPath=`.status.pendingWorkloads`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Queue struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   QueueSpec   `json:"spec,omitempty"`
	Status QueueStatus `json:"status,omitempty"`
}

// QueueList is a list of queues.
//
// +kubebuilder:object:root=true
type QueueList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Queue `json:"items"`
}

// QueueConditionValid is the condition type saying whether a queue is usable.
const QueueConditionValid = "Valid"

// QueueConditionControllerAssigned says which controller decides the
// queue's pods (the message names it); False, reason
// ReasonSplitRefused, when the queue's spec.controllerName differs from
// its root queue's and was not followed.
const QueueConditionControllerAssigned = "ControllerAssigned"

// Reasons of QueueConditionControllerAssigned.
const (
	ReasonControllerAssigned = "Assigned"
	ReasonSplitRefused       = "SplitRefused"
)
