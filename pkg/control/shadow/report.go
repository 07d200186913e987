// Package shadow compares a shadow controller's decisions with what the
// active controller did, as the pods show it, and keeps the report
// (--shadow; `kubectl tessera shadow` reads it):
//   - a workload the shadow admitted in its previous cycle that is still
//     gated now: would-admit (the active controller holds it);
//   - a workload the shadow held that the active controller ungated since:
//     would-hold;
//   - a workload the shadow would evict that still runs: would-reclaim;
//   - a workload the active controller evicted (its condition says
//     Reclaimed or OverLimit) that the shadow would keep: would-keep;
//   - both hold a workload, for different reasons: other-reason.
//
// Comparing the shadow's previous decision with the pods' state now gives
// the active controller a cycle's time to act; the first cycle reports
// nothing. A difference is reported once per workload until it goes away.
package shadow

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"time"
)

// Kinds of shadow differences: what the shadow controller would have done
// otherwise than the active one.
const (
	// WouldAdmit: the shadow admitted a workload the active controller
	// kept gated through the shadow's next cycle.
	WouldAdmit = "would-admit"
	// WouldHold: the active controller admitted a workload the shadow
	// held.
	WouldHold = "would-hold"
	// WouldReclaim: the shadow would evict a workload the active
	// controller kept running.
	WouldReclaim = "would-reclaim"
	// WouldKeep: the active controller evicted a workload the shadow
	// would keep running.
	WouldKeep = "would-keep"
	// OtherReason: both hold the workload, for different reasons.
	OtherReason = "other-reason"
)

// DifferenceKinds in the order reports show them.
var DifferenceKinds = []string{WouldAdmit, WouldHold, WouldReclaim, WouldKeep, OtherReason}

// ReportKey is the key of the report in the shadow's ConfigMap.
const ReportKey = "report.json"

// MaxEntries bounds the differences a report keeps (newest first).
const MaxEntries = 200

// Difference is one workload the shadow decided otherwise.
type Difference struct {
	Time     time.Time `json:"time"`
	Cycle    int64     `json:"cycle"`
	Kind     string    `json:"kind"`
	Queue    string    `json:"queue"`
	Workload string    `json:"workload"`
	Pods     int       `json:"pods,omitempty"`
	// Shadow and Active say what each did, and why.
	Shadow string `json:"shadow"`
	Active string `json:"active"`
}

// Report is what the shadow controller keeps in its ConfigMap.
type Report struct {
	Updated time.Time `json:"updated"`
	// Cycles counts the shadow's cycles since it started; Totals its
	// differences by kind since it started.
	Cycles int64            `json:"cycles"`
	Totals map[string]int64 `json:"totals"`
	// Last is the differences of the last cycle by kind.
	Last map[string]int `json:"last"`
	// Entries are the newest differences first, at most MaxEntries.
	Entries []Difference `json:"entries"`
	// Settings describe the shadow (its version and decision flags).
	Settings string `json:"settings,omitempty"`
}

// Add records a cycle's differences (newest first, bounded).
func (r *Report) Add(now time.Time, diffs []Difference) {
	r.Updated = now
	r.Cycles++
	if r.Totals == nil {
		r.Totals = map[string]int64{}
	}
	r.Last = map[string]int{}
	for _, d := range diffs {
		r.Totals[d.Kind]++
		r.Last[d.Kind]++
	}
	newest := append([]Difference(nil), diffs...)
	sort.SliceStable(newest, func(i, j int) bool { return newest[i].Workload < newest[j].Workload })
	r.Entries = append(newest, r.Entries...)
	if len(r.Entries) > MaxEntries {
		r.Entries = r.Entries[:MaxEntries]
	}
}

// Marshal is the report as the ConfigMap stores it.
func (r *Report) Marshal() (string, error) {
	data, err := json.Marshal(r)
	return string(data), err
}

// Parse reads a report from its ConfigMap data.
func Parse(data map[string]string) (*Report, error) {
	r := &Report{}
	s, ok := data[ReportKey]
	if !ok {
		return nil, fmt.Errorf("no %s in the shadow's ConfigMap (has the shadow run a cycle?)", ReportKey)
	}
	if err := json.Unmarshal([]byte(s), r); err != nil {
		return nil, fmt.Errorf("%s: %w", ReportKey, err)
	}
	return r, nil
}

// Print writes the report as a readable diff, newest first: "+" what the
// shadow would do, "-" what the active controller did.
func (r *Report) Print(w io.Writer, limit int) {
	fmt.Fprintf(w, "Shadow controller: %d cycles, last at %s\n", r.Cycles, r.Updated.Format(time.RFC3339))
	if r.Settings != "" {
		fmt.Fprintf(w, "Settings: %s\n", r.Settings)
	}
	fmt.Fprintf(w, "%-14s %10s %10s\n", "DIFFERENCE", "LAST CYCLE", "TOTAL")
	for _, k := range DifferenceKinds {
		fmt.Fprintf(w, "%-14s %10d %10d\n", k, r.Last[k], r.Totals[k])
	}
	if len(r.Entries) == 0 {
		fmt.Fprintln(w, "\nNo differences: the shadow decided as the active controller did.")
		return
	}
	fmt.Fprintln(w, "\nNewest first (+ shadow, - active):")
	for i, d := range r.Entries {
		if limit > 0 && i >= limit {
			fmt.Fprintf(w, "... %d older differences (--limit 0 shows all)\n", len(r.Entries)-limit)
			break
		}
		q := d.Queue
		if q == "" {
			q = "(none)"
		}
		fmt.Fprintf(w, "%s  cycle %d  %s  queue %s  %s\n", d.Time.Format(time.RFC3339), d.Cycle, d.Kind, q, d.Workload)
		fmt.Fprintf(w, "  + shadow: %s\n", d.Shadow)
		fmt.Fprintf(w, "  - active: %s\n", d.Active)
	}
}
