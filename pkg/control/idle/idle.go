// Package idle decides which pods sit idle under their queue's spec.idle:
// a pod whose claims used less than usedBelow of their allocation for the
// whole window `after`, with usage samples covering all of it.
//
// # Where the usage comes from
//
// The kubelet plugin samples every GPU process every --usage-interval and
// writes each claim's usage into the claim's status.devices data
// (v1alpha1.DeviceStatus.Usage), but only when it moved noticeably (the
// first sample, a process count that changed, memory by max(64 MiB, 5% of
// the device's allocation), SM utilization by 10 points). Its sampledAt is
// therefore the time of the last such change, and the value held from then
// until the next write. A claim's history is the chain of samples the
// controller saw (History.Observe, fed from every claim update the
// controller's informer delivers and from every pass): sample i held from
// its sampledAt until sample i+1's.
//
// # The rule
//
// A claim device's fraction is max(memoryUsedBytes/memoryLimitBytes,
// smUtilizationPercent/computeLimit); a claim's is the largest of its
// devices'. A device is unmeasured (fraction +Inf: never below) when it
// has no usage block, no memory limit, is a MIG device (NVML lists no
// processes on some MIG configurations and the plugin then writes 0, which
// cannot be told from idle) or reports processes holding 0 bytes (NVML
// without per-process memory, as under vGPU). A claim is below threshold u
// since the sampledAt of the oldest sample of the unbroken run of samples
// below u that ends with its newest sample. A pod is idle at time now when
// it has at least one claim of the driver and every one of its claims has
// been below since at most now - after. A claim whose status has no
// usage at all has no history: its pod is never idle. A restarted
// controller starts each claim's history at the claim's current sample,
// which is sound because that value has held since its sampledAt.
package idle

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// Policy is a queue's spec.idle, parsed.
type Policy struct {
	After time.Duration
	// UsedBelow is the threshold as a fraction (0.05 for "5%").
	UsedBelow float64
	Action    v1alpha1.IdleAction
}

// PolicyOf parses a queue's spec.idle; nil when it has none.
func PolicyOf(q *v1alpha1.Queue) (*Policy, error) {
	if q.Spec.Idle == nil {
		return nil, nil
	}
	in := q.Spec.Idle
	u, err := ParsePercent(in.UsedBelow)
	if err != nil {
		return nil, err
	}
	if in.After.Duration < time.Minute {
		return nil, fmt.Errorf("spec.idle.after %s is below 1m", in.After.Duration)
	}
	p := &Policy{After: in.After.Duration, UsedBelow: u, Action: in.Action}
	if p.Action == "" {
		p.Action = v1alpha1.IdleReport
	}
	if p.Action != v1alpha1.IdleReport && p.Action != v1alpha1.IdleEvict {
		return nil, fmt.Errorf("spec.idle.action %q is neither Report nor Evict", in.Action)
	}
	return p, nil
}

// ParsePercent parses "5%" (0 to 100%) into a fraction.
func ParsePercent(s string) (float64, error) {
	v, ok := strings.CutSuffix(strings.TrimSpace(s), "%")
	if !ok {
		return 0, fmt.Errorf("%q is not a percentage (such as 5%%)", s)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || f < 0 || f > 100 {
		return 0, fmt.Errorf("%q is not a percentage from 0%% to 100%%", s)
	}
	return f / 100, nil
}

// ClaimSample reads the driver's usage from a claim's status.devices: the
// sample time (the latest sampledAt of its devices), the claim's fraction
// (see the package comment; +Inf when a device is unmeasured) and whether
// the claim holds devices of the driver (ours) and all of them carry a
// usage block (sampled).
func ClaimSample(claim *resourceapi.ResourceClaim, driver string) (at time.Time, fraction float64, ours, sampled bool) {
	sampled = true
	for _, d := range claim.Status.Devices {
		if d.Driver != driver {
			continue
		}
		ours = true
		var st v1alpha1.DeviceStatus
		if d.Data == nil || json.Unmarshal(d.Data.Raw, &st) != nil || st.Usage == nil {
			sampled = false
			continue
		}
		if t := st.Usage.SampledAt.Time; t.After(at) {
			at = t
		}
		fraction = math.Max(fraction, deviceFraction(&st))
	}
	if !ours || !sampled {
		return time.Time{}, 0, ours, false
	}
	return at, fraction, true, true
}

func deviceFraction(st *v1alpha1.DeviceStatus) float64 {
	u := st.Usage
	if st.MemoryLimitBytes == 0 || st.MIGProfile != "" || (u.Processes > 0 && u.MemoryUsedBytes == 0) {
		return math.Inf(1)
	}
	f := float64(u.MemoryUsedBytes) / float64(st.MemoryLimitBytes)
	if st.ComputeLimit > 0 {
		f = math.Max(f, float64(u.SMUtilizationPercent)/float64(st.ComputeLimit))
	}
	return f
}

// maxRecords bounds a claim's history; the oldest records go first, which
// only moves the start of its coverage later (never counts more as idle).
const maxRecords = 256

// record is a sample kept in a claim's history: only the samples that are
// larger than every later one (suffix maxima) matter to BelowSince, the
// others are dropped as later, larger ones arrive.
type record struct {
	at       time.Time
	fraction float64
	// next is when the following sample came (zero: this is the newest).
	next time.Time
}

type claimHistory struct {
	first   time.Time // the oldest sample of the chain
	last    time.Time // the newest sample
	current float64   // the newest sample's fraction
	records []record  // suffix maxima, oldest first
	seen    bool      // seen in the current pass (Sweep)
}

// History is the usage history of claims, by UID. It is safe for
// concurrent use.
type History struct {
	mu     sync.Mutex
	claims map[types.UID]*claimHistory
}

// NewHistory returns an empty history.
func NewHistory() *History { return &History{claims: map[types.UID]*claimHistory{}} }

// ObserveClaim records the claim's current sample (see ClaimSample); a
// claim of the driver without usage loses its history.
func (h *History) ObserveClaim(claim *resourceapi.ResourceClaim, driver string) {
	at, f, ours, sampled := ClaimSample(claim, driver)
	switch {
	case !ours:
		return
	case !sampled:
		h.Reset(claim.UID)
	default:
		h.Observe(claim.UID, at, f)
	}
}

// Observe records a sample of a claim: from at on, it used fraction. A
// sample not newer than the newest one seen is ignored.
func (h *History) Observe(uid types.UID, at time.Time, fraction float64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.claims[uid]
	if c == nil {
		c = &claimHistory{first: at}
		h.claims[uid] = c
	} else if !at.After(c.last) {
		c.seen = true
		return
	}
	c.seen = true
	if n := len(c.records); n > 0 && c.records[n-1].next.IsZero() {
		c.records[n-1].next = at
	}
	for len(c.records) > 0 && c.records[len(c.records)-1].fraction <= fraction {
		c.records = c.records[:len(c.records)-1]
	}
	c.records = append(c.records, record{at: at, fraction: fraction})
	if len(c.records) > maxRecords {
		c.first = c.records[0].next
		c.records = c.records[1:]
	}
	c.last, c.current = at, fraction
}

// Reset forgets a claim's history.
func (h *History) Reset(uid types.UID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.claims, uid)
}

// Sweep forgets the claims not observed since the previous Sweep (claims
// that are gone).
func (h *History) Sweep() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for uid, c := range h.claims {
		if !c.seen {
			delete(h.claims, uid)
			continue
		}
		c.seen = false
	}
}

// BelowSince says since when a claim's samples have all been below the
// threshold u (a fraction): the start of the unbroken run of samples below
// u that ends with the newest. ok is false when the claim has no history
// or its newest sample is not below u.
func (h *History) BelowSince(uid types.UID, u float64) (since time.Time, current float64, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.claims[uid]
	if c == nil {
		return time.Time{}, 0, false
	}
	for i := len(c.records) - 1; i >= 0; i-- {
		if r := c.records[i]; r.fraction >= u {
			if r.next.IsZero() {
				return time.Time{}, c.current, false
			}
			return r.next, c.current, true
		}
	}
	return c.first, c.current, true
}

// Len is the number of claims with a history.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.claims)
}

// Verdict is the judgement on one pod or workload.
type Verdict struct {
	// Idle: every claim below the threshold for the whole window.
	Idle bool
	// Since is when the pod's claims were last above the threshold (or
	// their coverage starts); zero when they are not below now.
	Since time.Time
	// Used is the largest current fraction of the pod's claims.
	Used float64
	// Why says why a pod is not idle (for logs and tests).
	Why string
}

// Judge decides on one pod from its claims (UIDs of the claims holding
// devices of the driver).
func Judge(now time.Time, p *Policy, claims []types.UID, h *History) Verdict {
	if len(claims) == 0 {
		return Verdict{Why: "no claims with usage samples"}
	}
	var v Verdict
	for _, uid := range claims {
		since, cur, ok := h.BelowSince(uid, p.UsedBelow)
		if !math.IsInf(cur, 1) {
			v.Used = math.Max(v.Used, cur)
		}
		if !ok {
			if h.has(uid) {
				return Verdict{Used: v.Used, Why: "in use (or unmeasured)"}
			}
			return Verdict{Why: "no usage samples"}
		}
		if since.After(v.Since) {
			v.Since = since
		}
	}
	if now.Sub(v.Since) < p.After {
		v.Why = fmt.Sprintf("below only since %s", v.Since.UTC().Format(time.RFC3339))
		return v
	}
	v.Idle = true
	return v
}

func (h *History) has(uid types.UID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.claims[uid] != nil
}

// JudgeWorkload decides on a workload (a gang, or one pod) from its
// members' verdicts: idle only when every member is.
func JudgeWorkload(members []Verdict) Verdict {
	if len(members) == 0 {
		return Verdict{Why: "no members"}
	}
	out := Verdict{Idle: true}
	for _, m := range members {
		if !m.Idle {
			return Verdict{Why: "a member is not idle: " + m.Why}
		}
		out.Used = math.Max(out.Used, m.Used)
		if m.Since.After(out.Since) {
			out.Since = m.Since
		}
	}
	return out
}

// Message is the condition and event text for an idle workload.
func Message(now time.Time, p *Policy, v Verdict) string {
	return fmt.Sprintf("claims used at most %s of their allocation (threshold %s) since %s, %s (window %s)",
		FormatPercent(v.Used), FormatPercent(p.UsedBelow), v.Since.UTC().Format(time.RFC3339), now.Sub(v.Since).Round(time.Second), p.After)
}

// FormatPercent prints a fraction as a percentage.
func FormatPercent(f float64) string {
	return strconv.FormatFloat(math.Round(f*10000)/100, 'f', -1, 64) + "%"
}
