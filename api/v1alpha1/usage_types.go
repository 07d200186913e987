package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Decimal is a non-negative decimal number written as a string ("12.5"),
// so that kubectl prints it as it is (a resource.Quantity would print
// 12.5 GPU-hours as "12500m").
// +kubebuilder:validation:Pattern=`^[0-9]+(\.[0-9]+)?$`
// +kubebuilder:validation:MaxLength=40
type Decimal string

// UsageAmounts are amounts integrated over time: GPU-hours (GPU
// equivalents, as gpu.tessera.dev/gpus counts them, times hours) and GPU
// memory GiB-hours, allocated (held by claims) and used (what the claims'
// processes used: memory from the kubelet plugin's samples, GPUs as the SM
// utilization of the device).
type UsageAmounts struct {
	// +optional
	AllocatedGPUHours Decimal `json:"allocatedGPUHours,omitempty"`
	// +optional
	UsedGPUHours Decimal `json:"usedGPUHours,omitempty"`
	// +optional
	AllocatedMemoryGiBHours Decimal `json:"allocatedMemoryGiBHours,omitempty"`
	// +optional
	UsedMemoryGiBHours Decimal `json:"usedMemoryGiBHours,omitempty"`
}

// UsageRate is what was held and used at the last update: the rate the
// next update integrates up to its time.
type UsageRate struct {
	// +optional
	AllocatedGPUs Decimal `json:"allocatedGPUs,omitempty"`
	// +optional
	UsedGPUs Decimal `json:"usedGPUs,omitempty"`
	// +optional
	AllocatedMemoryGiB Decimal `json:"allocatedMemoryGiB,omitempty"`
	// +optional
	UsedMemoryGiB Decimal `json:"usedMemoryGiB,omitempty"`
}

// UsageRecord is the history of one namespace's claims on one GPU model in
// the queue's subtree.
type UsageRecord struct {
	// Namespace of the claims.
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// Model is the GPU's product name (the device attribute productName);
	// "unknown" when the device is not published.
	// +kubebuilder:validation:MaxLength=128
	Model string `json:"model"`
	// Rate is what was held and used at LastUpdated.
	// +optional
	Rate UsageRate `json:"rate,omitempty"`
	// Total is cumulative since the history started (Since).
	// +optional
	Total UsageAmounts `json:"total,omitempty"`
	// Decayed is exponentially decayed with the history's half-life.
	// +optional
	Decayed UsageAmounts `json:"decayed,omitempty"`
}

// UsageDayRecord is one namespace's and model's amounts of one day.
type UsageDayRecord struct {
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// +kubebuilder:validation:MaxLength=128
	Model        string `json:"model"`
	UsageAmounts `json:",inline"`
}

// UsageDay holds the amounts of one UTC day.
type UsageDay struct {
	// Date is the UTC day, YYYY-MM-DD.
	// +kubebuilder:validation:Pattern=`^[0-9]{4}-[0-9]{2}-[0-9]{2}$`
	Date string `json:"date"`
	// +optional
	// +kubebuilder:validation:MaxItems=1000
	Records []UsageDayRecord `json:"records,omitempty"`
}

// QueueUsage is the queue's usage history (its subtree's), kept by the
// controller in the Queue's status so that it survives a restart and a
// leader change: a new leader integrates from LastUpdated, with the rates
// recorded then, for at most the controller's --usage-max-gap.
type QueueUsage struct {
	// LastUpdated is when the amounts were last integrated.
	LastUpdated metav1.Time `json:"lastUpdated"`
	// Since is when this history started.
	Since metav1.Time `json:"since"`
	// HalfLife is the half-life the decayed amounts were computed with.
	// +optional
	HalfLife metav1.Duration `json:"halfLife,omitempty"`
	// Total sums the records' totals.
	// +optional
	Total UsageAmounts `json:"total,omitempty"`
	// Decayed sums the records' decayed amounts; time-based fair share
	// divides by it.
	// +optional
	Decayed UsageAmounts `json:"decayed,omitempty"`
	// Records: per namespace and GPU model.
	// +optional
	// +kubebuilder:validation:MaxItems=1000
	Records []UsageRecord `json:"records,omitempty"`
	// RetainedDays is how many UTC days of Days the controller keeps
	// (--usage-history-days).
	// +optional
	RetainedDays int32 `json:"retainedDays,omitempty"`
	// Days holds the amounts of the last --usage-history-days UTC days
	// (today included), oldest first; `kubectl tessera report --since`
	// reads them.
	// +optional
	// +kubebuilder:validation:MaxItems=400
	Days []UsageDay `json:"days,omitempty"`
}

// FairSharing tunes how a parent queue divides what is left beyond its
// children's quotas.
type FairSharing struct {
	// UsageWeighting divides it by the children's recent usage as well as
	// their weights (time-based fair share). Off by default.
	// +optional
	UsageWeighting *UsageWeighting `json:"usageWeighting,omitempty"`
}

// UsageWeighting makes a child's over-quota weight
// weight / (1 + factor * share), where share is the child's part (0 to 1)
// of its siblings' decayed allocated usage of the resource
// (status.usage.decayed; its half-life is the controller's
// --usage-half-life).
type UsageWeighting struct {
	// Enabled turns it on.
	Enabled bool `json:"enabled"`
	// Factor is how strongly usage counts; default 1, at most 100. With
	// 1, a child that had all the recent usage gets half its weight.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('0')) && !quantity(string(self)).isGreaterThan(quantity('100'))",message="factor must be between 0 and 100"
	Factor *resource.Quantity `json:"factor,omitempty"`
}
