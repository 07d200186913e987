//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// TestUsageAllocatedVsUsed: a pod in a queue holds a 4Gi share and its
// process "uses" 1Gi (the mock NVML reports host processes that set
// MOCK_GPU_MEMORY_USED as compute processes; the plugin maps the PID to
// the pod through the host's /proc, as on a real node). The plugin's
// metrics, the claim's status, the queue's status and `kubectl tessera
// top` all show 4Gi allocated and 1Gi used. Chart mode (the plugin's
// metrics port comes from the chart's local-cluster values).
func TestUsageAllocatedVsUsed(t *testing.T) {
	requireChart(t, "the metrics address is the chart's")
	usePlugin(t, defaultPlugin)
	ctx := t.Context()
	startController(t)
	queue := "usage-e2e"
	f := filepath.Join(t.TempDir(), "queue.yaml")
	if err := os.WriteFile(f, []byte("apiVersion: tessera.dev/v1alpha1\nkind: Queue\nmetadata: {name: "+queue+"}\nspec: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := cluster.Kubectl(ctx, "apply", "-f", f); err != nil {
		t.Fatalf("creating the queue: %v: %s", err, out)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = cluster.Kubectl(ctx, "delete", "-f", f, "--ignore-not-found")
	})
	ns := newNamespace(t)
	createTemplate(t, ns, shareTemplate("share-4gi", "4Gi", ""))
	p := claimPod("user", "share-4gi")
	p.Labels = map[string]string{v1alpha1.QueueLabel: queue}
	p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "MOCK_GPU_MEMORY_USED", Value: "1Gi"}, corev1.EnvVar{Name: "MOCK_GPU_SM_UTILIZATION", Value: "35"})
	createPod(t, ns, p)
	waitFor(t, 3*time.Minute, "pod user running", func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "user", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.Status.Phase == corev1.PodRunning, fmt.Errorf("phase %s", p.Status.Phase)
	})
	pod, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "user", metav1.GetOptions{})
	if err != nil || len(pod.Status.ResourceClaimStatuses) != 1 || pod.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("the pod's claim: %v %+v", err, pod.Status.ResourceClaimStatuses)
	}
	claimName := *pod.Status.ResourceClaimStatuses[0].ResourceClaimName
	const gib = 1 << 30

	// The plugin's metrics.
	labels := fmt.Sprintf(`claim="%s",device="gpu-\d+",namespace="%s",node="[^"]+",pod="user"`, claimName, ns)
	for metric, want := range map[string]string{
		"tessera_claim_memory_allocated_bytes": fmt.Sprint(4 * gib),
		"tessera_claim_memory_used_bytes":      fmt.Sprint(gib),
		"tessera_claim_sm_utilization_percent": "35",
	} {
		re := regexp.MustCompile(`(?m)^` + metric + `\{` + labels + `\} (\S+)$`)
		waitFor(t, time.Minute, metric+" = "+want, func(ctx context.Context) (bool, error) {
			body, err := scrape(ctx, "http://127.0.0.1:18390/metrics")
			if err != nil {
				return false, err
			}
			m := re.FindStringSubmatch(body)
			if m == nil {
				return false, fmt.Errorf("no %s for the claim", metric)
			}
			if parseFloat(m[1]) != parseFloat(want) {
				return false, fmt.Errorf("%s = %s", metric, m[1])
			}
			return true, nil
		})
	}

	// The claim's status.
	waitFor(t, time.Minute, "claim status shows 1Gi used of 4Gi", func(ctx context.Context) (bool, error) {
		c, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, claimName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, d := range c.Status.Devices {
			if d.Driver != "gpu.tessera.dev" || d.Data == nil {
				continue
			}
			var st v1alpha1.DeviceStatus
			if err := json.Unmarshal(d.Data.Raw, &st); err != nil {
				return false, err
			}
			if st.Usage != nil && st.Usage.MemoryUsedBytes == gib && st.MemoryLimitBytes == 4*gib && st.Usage.Processes == 1 {
				return true, nil
			}
			return false, fmt.Errorf("status %s", d.Data.Raw)
		}
		return false, fmt.Errorf("no Tessera entry in status.devices")
	})

	// The queue's status.
	waitFor(t, time.Minute, "queue shows 4Gi allocated, 1Gi used", func(ctx context.Context) (bool, error) {
		out, err := cluster.Kubectl(ctx, "get", "queue", queue, "-o", "jsonpath={.status.allocated.gpu\\.tessera\\.dev/memory} {.status.used.gpu\\.tessera\\.dev/memory}")
		if err != nil {
			return false, err
		}
		return strings.TrimSpace(out) == "4Gi 1Gi", fmt.Errorf("allocated, used: %q", out)
	})
	if out, err := cluster.Kubectl(ctx, "get", "queues", queue); err == nil {
		t.Logf("kubectl get queues:\n%s", out)
	}

	// kubectl tessera top, against the cluster's kubeconfig.
	bin := filepath.Join(t.TempDir(), "kubectl-tessera")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/kubectl-tessera")
	build.Dir = cluster.Opts.RepoRoot
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building kubectl-tessera: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"top", "-n", ns}, {"top", "-A", "--by", "queue"}} {
		cmd := exec.CommandContext(ctx, bin, append(args, "--kubeconfig", cluster.Kubeconfig)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl tessera %v: %v\n%s", args, err, out)
		}
		t.Logf("kubectl tessera %s:\n%s", strings.Join(args, " "), out)
		row := ""
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, claimName) || strings.HasPrefix(l, queue+" ") {
				row = l
			}
		}
		for _, want := range []string{"4Gi", "1Gi", "25%", "3Gi"} {
			if !strings.Contains(row, want) {
				t.Errorf("kubectl tessera %v: row %q lacks %s", args, row, want)
			}
		}
	}
}

func scrape(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func parseFloat(s string) float64 {
	var f float64
	_, _ = fmt.Sscan(s, &f)
	return f
}
