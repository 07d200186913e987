//go:build e2e

package e2e

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

// historyInterval is the controller's --usage-history-interval on the
// local cluster (deployments/helm/values/localcluster.yaml,
// controller.usageHistory.interval).
const historyInterval = 5 * time.Second

// applyQueues applies Queue documents (YAML, "---" between them) and
// deletes them at cleanup in reverse order (children before parents).
func applyQueues(t *testing.T, docs ...string) {
	t.Helper()
	dir := t.TempDir()
	var files []string
	for i, d := range docs {
		f := filepath.Join(dir, fmt.Sprintf("q%d.yaml", i))
		if err := os.WriteFile(f, []byte("apiVersion: tessera.dev/v1alpha1\nkind: Queue\n"+d), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := cluster.Kubectl(t.Context(), "apply", "-f", f); err != nil {
			t.Fatalf("applying queue %q: %v: %s", d, err, out)
		}
		files = append(files, f)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for i := len(files) - 1; i >= 0; i-- {
			_, _ = cluster.Kubectl(ctx, "delete", "-f", files[i], "--ignore-not-found")
		}
	})
}

// held is what one pod's claim held: its share of the GPU memory and, as
// gpu.tessera.dev/gpus counts a share, that share of a GPU.
type held struct {
	ns, name, model string
	memGiB, gpus    float64
}

// claimHeld reads the allocation of a running pod's one claim and the
// device's memory capacity from its ResourceSlice.
func claimHeld(t *testing.T, ns, name string) held {
	t.Helper()
	ctx := t.Context()
	pod, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil || len(pod.Status.ResourceClaimStatuses) != 1 || pod.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("pod %s/%s's claim: %v", ns, name, err)
	}
	c, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, *pod.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
	if err != nil || c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim of %s/%s: %v %+v", ns, name, err, c.Status.Allocation)
	}
	r := c.Status.Allocation.Devices.Results[0]
	consumed, ok := r.ConsumedCapacity[devicemodel.CapMemory]
	if !ok {
		t.Fatalf("claim of %s/%s consumes no memory: %+v", ns, name, r)
	}
	slices, err := cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slices.Items {
		if s.Spec.Driver != devicemodel.DriverName || s.Spec.Pool.Name != r.Pool {
			continue
		}
		for _, d := range s.Spec.Devices {
			if d.Name != r.Device {
				continue
			}
			total := d.Capacity[devicemodel.CapMemory].Value
			model := ""
			if a, ok := d.Attributes[devicemodel.AttrProductName]; ok && a.StringValue != nil {
				model = *a.StringValue
			}
			return held{ns: ns, name: name, model: model, memGiB: float64(consumed.Value()) / (1 << 30),
				gpus: float64(consumed.Value()) / float64(total.Value())}
		}
	}
	t.Fatalf("device %s/%s of %s/%s not in any ResourceSlice", r.Pool, r.Device, ns, name)
	return held{}
}

// TestUsageReport: two pods of one queue, in two namespaces, hold a 4Gi
// and a 2Gi share of a T4 for about 80 s and 110 s and end. The
// controller integrates the queue's usage history every 5 s
// (historyInterval); `kubectl tessera report -o csv` must then show per
// namespace allocated GiB-hours and GPU-hours equal to the pod's share
// times its container's run (finishedAt - startedAt from the pod's own
// status), and `kubectl get queues -o wide` the decayed history.
//
// Tolerance, per pod: share x (historyInterval + 10 s). The history sees
// a claim from the first update after it is allocated and reserved and
// until the first update after its pod is Succeeded, so each end is off
// by at most one interval, plus the time between the claim's reservation
// and the container's start (prepare, container creation) and between the
// container's exit and the pod's phase reaching the controller (10 s
// covers both on this cluster; the test logs the real error).
func TestUsageReport(t *testing.T) {
	requireChart(t, "the history interval is set by the chart's local-cluster values")
	inParallel(t)
	ctx := t.Context()
	const queue = "report-e2e"
	applyQueues(t, "metadata: {name: "+queue+"}\nspec: {}\n")

	// Build the plugin binary while the pods run.
	bin := filepath.Join(t.TempDir(), "kubectl-tessera")
	built := make(chan error, 1)
	go func() {
		build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/kubectl-tessera")
		build.Dir = cluster.Opts.RepoRoot
		out, err := build.CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, out)
		}
		built <- err
	}()

	jobs := []struct {
		name, mem string
		secs      int
	}{{"p4", "4Gi", 80}, {"p2", "2Gi", 110}}
	var pods []held
	for _, j := range jobs {
		ns := newNamespace(t)
		createTemplate(t, ns, shareTemplate("share", j.mem, ""))
		p := busyboxPod(j.name, "sleep", strconv.Itoa(j.secs))
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: new("share")}}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
		p.Labels = map[string]string{v1alpha1.QueueLabel: queue}
		createPod(t, ns, p)
		pods = append(pods, held{ns: ns, name: j.name})
	}
	for i, p := range pods {
		waitPodPhase(t, p.ns, p.name, corev1.PodRunning, 2*time.Minute)
		pods[i] = claimHeld(t, p.ns, p.name)
		t.Logf("%s/%s holds %.3f GiB, %.4f GPUs of a %s", p.ns, p.name, pods[i].memGiB, pods[i].gpus, pods[i].model)
	}
	// The expected amounts, from the pods' own container timestamps.
	type amounts struct{ gpuH, gibH, tolGPU, tolGiB float64 }
	want := map[string]amounts{}
	var lastEnd time.Time
	for _, p := range pods {
		pod := waitPodPhase(t, p.ns, p.name, corev1.PodSucceeded, 3*time.Minute)
		term := pod.Status.ContainerStatuses[0].State.Terminated
		if term == nil {
			t.Fatalf("%s/%s: no terminated state: %+v", p.ns, p.name, pod.Status.ContainerStatuses[0])
		}
		ran := term.FinishedAt.Sub(term.StartedAt.Time)
		slack := (historyInterval + 10*time.Second).Hours()
		want[p.ns] = amounts{gpuH: p.gpus * ran.Hours(), gibH: p.memGiB * ran.Hours(), tolGPU: p.gpus * slack, tolGiB: p.memGiB * slack}
		t.Logf("%s/%s ran %s (%s to %s)", p.ns, p.name, ran, term.StartedAt.UTC().Format(time.TimeOnly), term.FinishedAt.UTC().Format(time.TimeOnly))
		if term.FinishedAt.After(lastEnd) {
			lastEnd = term.FinishedAt.Time
		}
	}
	// Wait until an update after the last pod ended recorded no rate.
	var q v1alpha1.Queue
	waitFor(t, time.Minute, "the queue's history to record the pods' end", func(ctx context.Context) (bool, error) {
		out, err := cluster.Kubectl(ctx, "get", "queue", queue, "-o", "json")
		if err != nil {
			return false, err
		}
		q = v1alpha1.Queue{}
		if err := json.Unmarshal([]byte(out), &q); err != nil {
			return false, err
		}
		u := q.Status.Usage
		if u == nil {
			return false, fmt.Errorf("no status.usage")
		}
		for _, r := range u.Records {
			if r.Rate != (v1alpha1.UsageRate{}) {
				return false, fmt.Errorf("namespace %s still has rate %+v", r.Namespace, r.Rate)
			}
		}
		return u.LastUpdated.After(lastEnd.Add(historyInterval)), fmt.Errorf("last updated %s", u.LastUpdated)
	})

	if err := <-built; err != nil {
		t.Fatalf("building kubectl-tessera: %v", err)
	}
	cmd := exec.CommandContext(ctx, bin, "report", "--since", "1d", "-o", "csv", "--price", "t4=0.35/h", "--kubeconfig", cluster.Kubeconfig)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl tessera report: %v\n%s", err, out)
	}
	t.Logf("kubectl tessera report --since 1d -o csv:\n%s", out)
	rows, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil || len(rows) == 0 {
		t.Fatalf("report csv: %v", err)
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	num := func(row []string, name string) float64 {
		v, err := strconv.ParseFloat(row[col[name]], 64)
		if err != nil {
			t.Fatalf("report column %s: %q", name, row[col[name]])
		}
		return v
	}
	seen := map[string]bool{}
	for _, row := range rows[1:] {
		if row[col["QUEUE"]] != queue {
			continue
		}
		ns := row[col["NAMESPACE"]]
		w, ok := want[ns]
		if !ok {
			t.Errorf("report row for namespace %s, which ran no pod of %s: %v", ns, queue, row)
			continue
		}
		seen[ns] = true
		if model := pods[0].model; row[col["MODEL"]] != model {
			t.Errorf("namespace %s: model %q, want %q", ns, row[col["MODEL"]], model)
		}
		gpuH, gibH := num(row, "GPU-H ALLOC"), num(row, "GIB-H ALLOC")
		t.Logf("namespace %s: GPU-hours %.6f (pods: %.6f, error %+.1f%%), GiB-hours %.6f (pods: %.6f, error %+.1f%%)",
			ns, gpuH, w.gpuH, 100*(gpuH-w.gpuH)/w.gpuH, gibH, w.gibH, 100*(gibH-w.gibH)/w.gibH)
		if math.Abs(gpuH-w.gpuH) > w.tolGPU {
			t.Errorf("namespace %s: allocated GPU-hours %.6f, the pods held %.6f (tolerance %.6f)", ns, gpuH, w.gpuH, w.tolGPU)
		}
		if math.Abs(gibH-w.gibH) > w.tolGiB {
			t.Errorf("namespace %s: allocated GiB-hours %.6f, the pods held %.6f (tolerance %.6f)", ns, gibH, w.gibH, w.tolGiB)
		}
		if c := num(row, "COST"); math.Abs(c-0.35*gpuH) > 1e-5 {
			t.Errorf("namespace %s: cost %.6f, want 0.35/h x %.6f GPU-hours", ns, c, gpuH)
		}
	}
	for ns := range want {
		if !seen[ns] {
			t.Errorf("no report row for queue %s, namespace %s", queue, ns)
		}
	}

	// The cumulative total and the decayed amount (30m half-life over a
	// few minutes: a few percent less) in the status, shown by -o wide.
	total := parseFloat(string(q.Status.Usage.Total.AllocatedMemoryGiBHours))
	decayed := parseFloat(string(q.Status.Usage.Decayed.AllocatedMemoryGiBHours))
	if total <= 0 || decayed >= total || decayed < 0.8*total {
		t.Errorf("status.usage: total %v GiB-hours, decayed %v: want 0.8 x total <= decayed < total", total, decayed)
	}
	wide, err := cluster.Kubectl(ctx, "get", "queues", queue, "-o", "wide")
	if err != nil {
		t.Fatalf("kubectl get queues -o wide: %v: %s", err, wide)
	}
	t.Logf("kubectl get queues -o wide:\n%s", wide)
	lines := strings.Split(strings.TrimSpace(wide), "\n")
	if len(lines) != 2 {
		t.Fatalf("kubectl get queues -o wide: %d lines", len(lines))
	}
	// kubectl aligns the cells under their headers (empty cells are blank).
	at := strings.Index(lines[0], "GIBH-ALLOC")
	if at < 0 {
		t.Fatalf("-o wide has no GIBH-ALLOC column: %s", lines[0])
	}
	cell := ""
	if at < len(lines[1]) {
		cell = strings.Fields(lines[1][at:] + " ")[0]
	}
	// The decayed amount keeps decaying at every update: compare with
	// the bounds, not the value read before.
	if v := parseFloat(cell); v <= 0.8*total || v > total {
		t.Errorf("-o wide GIBH-ALLOC is %q: want the decayed GiB-hours, between 0.8 x and 1 x the total %v", cell, total)
	}
}
