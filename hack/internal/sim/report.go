package sim

import (
	"fmt"
	"io"
	"time"
)

// WriteMarkdown prints results as a Markdown table, with ratios against the
// whole-GPU baseline measured in the same run.
func WriteMarkdown(w io.Writer, results []Result) {
	var base Result
	for _, r := range results {
		if r.Policy == WholeGPU {
			base = r
		}
	}
	queued := false
	for _, r := range results {
		queued = queued || r.AdmissionTime > 0
	}
	head, rule := "| policy | placed | pending |", "|---|---:|---:|"
	if queued {
		head, rule = head+" held by queues | admission cycle |", rule+"---:|---:|"
	}
	fmt.Fprintln(w, head+" GPUs used | lower bound | GPUs / bound | pods per GPU | vs whole GPU | memory allocated / available | requested / available | pods over GPU memory |")
	fmt.Fprintln(w, rule+"---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range results {
		bound := "-"
		if r.LowerBound > 0 {
			bound = fmt.Sprintf("%.2fx", float64(r.GPUsUsed)/float64(r.LowerBound))
		}
		vs := "-"
		if base.PodsPerGPU() > 0 {
			vs = fmt.Sprintf("%.2fx", r.PodsPerGPU()/base.PodsPerGPU())
		}
		fmt.Fprintf(w, "| %s | %d | %d |", r.Policy, r.Placed, r.Pending)
		if queued {
			fmt.Fprintf(w, " %d | %s |", r.HeldByQueue, r.AdmissionTime.Round(time.Millisecond))
		}
		fmt.Fprintf(w, " %d | %d | %s | %.2f | %s | %.0f%% | %.0f%% | %d |\n",
			r.GPUsUsed, r.LowerBound, bound, r.PodsPerGPU(), vs, 100*r.Utilization(), 100*r.RequestedShare(), r.OverCommitted)
	}
}
