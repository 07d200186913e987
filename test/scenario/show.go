package scenario

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/pkg/kubectl/top"
)

// FormatMemory prints a byte quantity in the largest binary unit that
// divides it (8000Mi, 4Gi), else in bytes.
func FormatMemory(q *resource.Quantity) string {
	if q == nil {
		return "-"
	}
	v := q.Value()
	switch {
	case v == 0:
		return "0"
	case v%(1<<30) == 0:
		return fmt.Sprintf("%dGi", v>>30)
	case v%(1<<20) == 0:
		return fmt.Sprintf("%dMi", v>>20)
	}
	return fmt.Sprintf("%d", v)
}

func short(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

// Show prints where the pods landed, how each GPU is shared and what each
// container sees.
func (r *Run) Show(ctx context.Context, pls []Placement) {
	if r.Out == nil || len(pls) == 0 {
		return
	}
	r.printf("\n  where the claims landed (claim status.allocation, read through the API):\n")
	tw := tabwriter.NewWriter(r.Out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "    POD\tPHASE\tDEVICE\tTYPE\tSHARE ID\tMEMORY\tGPU\n")
	type use struct {
		pod, device, mem string
		bytes            int64
	}
	byGPU := map[string][]use{}
	product := map[string]string{}
	var pending []string
	for _, pl := range pls {
		phase := string(pl.Pod.Status.Phase)
		if pl.Pod.Status.Phase == corev1.PodPending {
			if reason := PendingReason(pl.Pod); reason != "" {
				pending = append(pending, fmt.Sprintf("%s: %s", pl.Pod.Name, reason))
			}
		}
		n := 0
		for _, c := range pl.Claims {
			for _, d := range c.Devices {
				n++
				share := "-"
				if d.ShareID != "" {
					share = short(d.ShareID, 9)
				}
				fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\t%s\t%s %s\n", pl.Pod.Name, phase, d.Name, d.Type(), share,
					FormatMemory(d.Memory), d.Attributes["productName"], short(d.GPU(), 16))
				var b int64
				if d.Memory != nil {
					b = d.Memory.Value()
				}
				byGPU[d.GPU()] = append(byGPU[d.GPU()], use{pl.Pod.Name, d.Name, FormatMemory(d.Memory), b})
				product[d.GPU()] = d.Attributes["productName"]
			}
		}
		if n == 0 {
			what := "(no device allocated yet)"
			if pl.Pod.Status.Phase == corev1.PodSucceeded || pl.Pod.Status.Phase == corev1.PodFailed {
				what = "(ended: its claim was released)"
			}
			fmt.Fprintf(tw, "    %s\t%s\t%s\t\t\t\t\n", pl.Pod.Name, phase, what)
		}
	}
	tw.Flush()

	gpus := make([]string, 0, len(byGPU))
	for g := range byGPU {
		gpus = append(gpus, g)
	}
	sort.Strings(gpus)
	capacity := r.gpuCapacities(ctx)
	if len(gpus) > 0 {
		r.printf("\n  per GPU:\n")
	}
	for _, g := range gpus {
		uses := byGPU[g]
		var parts []string
		var total int64
		for _, u := range uses {
			parts = append(parts, fmt.Sprintf("%s %s (%s)", u.pod, u.mem, u.device))
			total += u.bytes
		}
		line := fmt.Sprintf("    %s %s: %s = %s", product[g], short(g, 16), strings.Join(parts, " + "), FormatMemory(resource.NewQuantity(total, resource.BinarySI)))
		if c, ok := capacity[g]; ok {
			line += fmt.Sprintf(" of %s allocatable", FormatMemory(c))
		}
		r.printf("%s\n", line)
	}
	if len(pending) > 0 {
		r.printf("\n  pending (the scheduler's reason, from the pod's PodScheduled condition):\n")
		for _, p := range pending {
			r.printf("    %s\n", p)
		}
	}
	var seen bool
	for _, pl := range pls {
		if pl.Log == "" {
			continue
		}
		if !seen {
			r.printf("\n  what the containers see (`env | grep -E 'TESSERA|CUDA|NVIDIA' | sort` in each):\n")
			seen = true
		}
		r.printf("    %s:\n", pl.Pod.Name)
		for _, l := range strings.Split(strings.TrimSpace(pl.Log), "\n") {
			r.printf("      %s\n", l)
		}
	}
	r.printf("\n")
}

// gpuCapacities returns the published memory of each whole GPU (type gpu
// devices), by UUID.
func (r *Run) gpuCapacities(ctx context.Context) map[string]*resource.Quantity {
	out := map[string]*resource.Quantity{}
	list, err := r.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return out
	}
	for _, d := range indexDevices(list.Items) {
		var typ, uuid string
		for name, a := range d.dev.Attributes {
			switch string(name) {
			case "type", Driver + "/type":
				typ = attributeString(a)
			case "uuid", Driver + "/uuid":
				uuid = attributeString(a)
			}
		}
		if typ != "gpu" {
			continue
		}
		if c, ok := d.dev.Capacity["memory"]; ok {
			q := c.Value.DeepCopy()
			out[uuid] = &q
		}
	}
	return out
}

// DeletePod deletes one pod and waits until it is gone.
func (r *Run) DeletePod(ctx context.Context, name string, timeout time.Duration) error {
	grace := int64(1)
	if err := r.Client.CoreV1().Pods(r.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		_, err := r.Client.CoreV1().Pods(r.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s still exists after deletion: %w", name, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// freeExclusive is the whole-GPU scenario's ending: the exclusive pod goes,
// and the share that insisted on its GPU starts there.
func freeExclusive(ctx context.Context, r *Run) error {
	r.printf("  freeing GPU 0: $ kubectl delete pod -n %s exclusive\n", r.Namespace)
	start := time.Now()
	if err := r.DeletePod(ctx, "exclusive", time.Minute); err != nil {
		return err
	}
	r.printf("    exclusive gone (%.1fs); share-on-gpu0 should start now\n", time.Since(start).Seconds())
	r.Expect["share-on-gpu0"] = corev1.PodRunning
	if err := r.WaitPods(ctx, nil); err != nil {
		return err
	}
	pls, err := r.Placements(ctx)
	if err != nil {
		return err
	}
	r.Show(ctx, pls)
	checked, problems := Verify(pls)
	for _, c := range checked {
		r.printf("  ✓ %s\n", c)
	}
	if len(problems) > 0 {
		return fmt.Errorf("what the containers see does not match the allocation:\n  %s", strings.Join(problems, "\n  "))
	}
	return nil
}

// Verify checks what the demo tells: every running container with one
// allocated device sees that device (its UUID, or a MIG UUID for a MIG
// device) and a memory limit equal to what was allocated. It returns what
// it checked and the problems found.
func Verify(pls []Placement) (checked []string, problems []string) {
	var n int
	for _, pl := range pls {
		if pl.Env == nil || len(pl.Claims) != 1 || len(pl.Claims[0].Devices) != 1 {
			continue
		}
		d := pl.Claims[0].Devices[0]
		n++
		if d.Memory != nil {
			if got, want := pl.Env["TESSERA_MEMORY_LIMIT"], fmt.Sprint(d.Memory.Value()); got != want {
				problems = append(problems, fmt.Sprintf("%s: TESSERA_MEMORY_LIMIT=%s, but %s was allocated (%s bytes)", pl.Pod.Name, got, FormatMemory(d.Memory), want))
			}
			if got, ok := pl.Env["CUDA_DEVICE_MEMORY_LIMIT_0"]; ok && got != fmt.Sprintf("%dm", d.Memory.Value()>>20) {
				problems = append(problems, fmt.Sprintf("%s: CUDA_DEVICE_MEMORY_LIMIT_0=%s, but %s was allocated", pl.Pod.Name, got, FormatMemory(d.Memory)))
			}
		}
		visible := pl.Env["NVIDIA_VISIBLE_DEVICES"]
		switch {
		case d.Type() == "mig" && !strings.HasPrefix(visible, "MIG-"):
			problems = append(problems, fmt.Sprintf("%s: NVIDIA_VISIBLE_DEVICES=%q is not a MIG device", pl.Pod.Name, visible))
		case d.Type() != "mig" && visible != d.Attributes["uuid"]:
			problems = append(problems, fmt.Sprintf("%s: NVIDIA_VISIBLE_DEVICES=%q, but %s is %s", pl.Pod.Name, visible, d.Name, d.Attributes["uuid"]))
		}
	}
	if n > 0 {
		checked = append(checked, fmt.Sprintf("in all %d running containers the memory limit equals the allocation and the visible device is the allocated one", n))
	}
	return checked, problems
}

// showUsage is the showdown's ending: what each pod's claim was allocated
// next to what its process uses, once the kubelet plugin has seen the
// process of every claim (each showdown pod runs one), as the table
// `kubectl tessera top` prints.
func showUsage(ctx context.Context, r *Run) error {
	r.printf("  allocated vs used (the plugin samples each claim's processes; $ kubectl tessera top -n %s):\n", r.Namespace)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		claims, err := r.Client.ResourceV1().ResourceClaims(r.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		pods, err := r.Client.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		byName := map[string]*corev1.Pod{}
		for i := range pods.Items {
			byName[r.Namespace+"/"+pods.Items[i].Name] = &pods.Items[i]
		}
		rows := top.Claims(claims.Items, byName, Driver)
		sampled := 0
		for _, row := range rows {
			if row.Processes > 0 {
				sampled++
			}
		}
		if len(rows) > 0 && sampled == len(rows) {
			if err := top.Sort(rows, top.SortWaste); err != nil {
				return err
			}
			var buf strings.Builder
			if err := top.Print(&buf, rows, top.ByClaim); err != nil {
				return err
			}
			r.printf("%s", indent(buf.String(), "    "))
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after a minute the plugin has seen the processes of %d of %d claims (is it sampling? --usage-interval, --host-proc-root)", sampled, len(rows))
		case <-time.After(time.Second):
		}
	}
}

// lastLines returns the last n lines of s, newline-terminated.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + "\n"
}

// indent prefixes every line of s.
func indent(s, prefix string) string {
	var sb strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		sb.WriteString(prefix + l + "\n")
	}
	return sb.String()
}
