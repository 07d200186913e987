// Package top lists what Tessera's claims are allocated and what their
// processes really use, from the usage the kubelet plugins write into the
// claims' status (v1alpha1.DeviceStatus): per claim, or summed per
// namespace, queue or node, sorted by waste (allocated but not used).
// `kubectl tessera top` is its command.
package top

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// Group-by and sort keys.
const (
	ByClaim     = "claim"
	ByNamespace = "namespace"
	ByQueue     = "queue"
	ByNode      = "node"

	SortWaste     = "waste"
	SortUsed      = "used"
	SortAllocated = "allocated"
)

// Row is a claim, or a group of claims.
type Row struct {
	Namespace, Claim, Pod, Node, Queue string
	// From names the systems whose keys Tessera translated into the pod's
	// claims (annotation tessera.dev/translated: device-plugin, hami, kai);
	// "" for a pod written with claims.
	From string
	// Claims counts the claims in a group (1 for a claim).
	Claims int
	// Allocated is the device memory the claims were given; Used what
	// their processes hold at the plugins' last samples. Sampled counts
	// the claims with a sample: the others are unknown, not idle.
	Allocated, Used uint64
	Sampled         int
	// SampledAllocated is the allocation of the sampled claims: waste and
	// the used ratio are computed against it.
	SampledAllocated uint64
	// SM is the claims' SM utilization (percent of a device, summed);
	// Processes counts their processes on the devices.
	SM, Processes int
}

// Waste is memory allocated to sampled claims and not used.
func (r Row) Waste() uint64 {
	if r.Sampled == 0 || r.Used > r.SampledAllocated {
		return 0
	}
	return r.SampledAllocated - r.Used
}

// Claims returns one row per claim with devices of driver: its pod (the
// first consumer), node (the pool), queue (the pod's queue label),
// allocation and usage. pods are looked up by namespace/name.
func Claims(claims []resourceapi.ResourceClaim, pods map[string]*corev1.Pod, driver string) []Row {
	var out []Row
	for i := range claims {
		c := &claims[i]
		if c.Status.Allocation == nil {
			continue
		}
		row := Row{Namespace: c.Namespace, Claim: c.Name, Claims: 1}
		ours := false
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == driver {
				ours, row.Node = true, r.Pool
			}
		}
		if !ours {
			continue
		}
		sampled := false
		for _, d := range c.Status.Devices {
			if d.Driver != driver || d.Data == nil {
				continue
			}
			var st v1alpha1.DeviceStatus
			if err := json.Unmarshal(d.Data.Raw, &st); err != nil {
				continue
			}
			row.Allocated += st.MemoryLimitBytes
			if st.Usage != nil {
				sampled = true
				row.Used += st.Usage.MemoryUsedBytes
				row.SM += st.Usage.SMUtilizationPercent
				row.Processes += st.Usage.Processes
			}
		}
		if sampled {
			row.Sampled, row.SampledAllocated = 1, row.Allocated
		}
		for _, ref := range c.Status.ReservedFor {
			if ref.Resource == "pods" && ref.APIGroup == "" {
				row.Pod = ref.Name
				if p := pods[c.Namespace+"/"+ref.Name]; p != nil {
					row.Queue = p.Labels[v1alpha1.QueueLabel]
					row.From = v1alpha1.TranslatedFrom(p.Annotations[v1alpha1.TranslatedAnnotation])
				}
				break
			}
		}
		out = append(out, row)
	}
	return out
}

// Group sums rows by namespace, queue or node; ByClaim returns them as
// they are. The group's name is in the field grouped by.
func Group(rows []Row, by string) ([]Row, error) {
	key := map[string]func(Row) string{
		ByNamespace: func(r Row) string { return r.Namespace },
		ByQueue:     func(r Row) string { return r.Queue },
		ByNode:      func(r Row) string { return r.Node },
	}
	if by == ByClaim {
		return rows, nil
	}
	k, ok := key[by]
	if !ok {
		return nil, fmt.Errorf("--by=%q: use claim, namespace, queue or node", by)
	}
	groups := map[string]*Row{}
	var order []string
	for _, r := range rows {
		name := k(r)
		g := groups[name]
		if g == nil {
			g = &Row{}
			switch by {
			case ByNamespace:
				g.Namespace = name
			case ByQueue:
				g.Queue = name
			case ByNode:
				g.Node = name
			}
			groups[name] = g
			order = append(order, name)
		}
		g.Claims += r.Claims
		g.Allocated += r.Allocated
		g.Sampled += r.Sampled
		g.SampledAllocated += r.SampledAllocated
		g.SM += r.SM
		g.Processes += r.Processes
		g.Used += r.Used
	}
	out := make([]Row, 0, len(order))
	for _, name := range order {
		out = append(out, *groups[name])
	}
	return out, nil
}

// Sort orders rows by waste, used or allocated memory, largest first;
// rows without a sample come last.
func Sort(rows []Row, by string) error {
	val := map[string]func(Row) uint64{
		SortWaste:     Row.Waste,
		SortUsed:      func(r Row) uint64 { return r.Used },
		SortAllocated: func(r Row) uint64 { return r.Allocated },
	}[by]
	if val == nil {
		return fmt.Errorf("--sort=%q: use waste, used or allocated", by)
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if (rows[i].Sampled > 0) != (rows[j].Sampled > 0) {
			return rows[i].Sampled > 0
		}
		if vi, vj := val(rows[i]), val(rows[j]); vi != vj {
			return vi > vj
		}
		return rows[i].Namespace+"/"+rows[i].Claim < rows[j].Namespace+"/"+rows[j].Claim
	})
	return nil
}

// Print writes rows as a table: per claim, or per group. Per claim, a
// FROM column names what a translated pod was written for (device-plugin,
// hami, kai) when any row was translated.
func Print(w io.Writer, rows []Row, by string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	from := false
	for _, r := range rows {
		from = from || r.From != ""
	}
	var head []string
	switch by {
	case ByClaim:
		head = []string{"NAMESPACE", "CLAIM", "POD", "QUEUE", "NODE"}
		if from {
			head = append(head, "FROM")
		}
	case ByNamespace:
		head = []string{"NAMESPACE", "CLAIMS"}
	case ByQueue:
		head = []string{"QUEUE", "CLAIMS"}
	case ByNode:
		head = []string{"NODE", "CLAIMS"}
	}
	head = append(head, "ALLOCATED", "USED", "USED%", "SM%", "WASTE")
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, r := range rows {
		var cells []string
		switch by {
		case ByClaim:
			cells = []string{r.Namespace, r.Claim, dash(r.Pod), dash(r.Queue), dash(r.Node)}
			if from {
				cells = append(cells, dash(r.From))
			}
		case ByNamespace:
			cells = []string{r.Namespace, fmt.Sprint(r.Claims)}
		case ByQueue:
			cells = []string{dash(r.Queue), fmt.Sprint(r.Claims)}
		case ByNode:
			cells = []string{dash(r.Node), fmt.Sprint(r.Claims)}
		}
		used, pct, sm, waste := "-", "-", "-", "-"
		if r.Sampled > 0 {
			used, sm, waste = formatBytes(r.Used), fmt.Sprint(r.SM), formatBytes(r.Waste())
			if r.SampledAllocated > 0 {
				pct = fmt.Sprintf("%d%%", r.Used*100/r.SampledAllocated)
			}
		}
		cells = append(cells, formatBytes(r.Allocated), used, pct, sm, waste)
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func formatBytes(v uint64) string {
	return resource.NewQuantity(int64(v), resource.BinarySI).String()
}
