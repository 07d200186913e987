//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// TestWhatIfPredicts: `kubectl tessera what-if -f new-queues.yaml` on the
// live cluster names the pending pods that start with a raised queue
// limit; applying the same file for real starts exactly those (the
// controller's next cycles), and the rest keep waiting.
func TestWhatIfPredicts(t *testing.T) {
	usePlugin(t, defaultPlugin)
	ctx := t.Context()
	startController(t)
	queue := func(limit string) string {
		return fmt.Sprintf("apiVersion: tessera.dev/v1alpha1\nkind: Queue\nmetadata: {name: whatif-a}\nspec:\n  resources:\n    gpu.tessera.dev/memory: {quota: %s, limit: %s}\n", limit, limit)
	}
	applyYAML(t, queue("1Gi"))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = cluster.Kubectl(ctx, "delete", "queue", "whatif-a", "--ignore-not-found")
	})
	ns := newNamespace(t)
	createTemplate(t, ns, shareTemplate("share-1gi", "1Gi", ""))
	pods := []string{"w1", "w2", "w3", "w4"}
	for _, name := range pods {
		p := claimPod(name, "share-1gi")
		p.Labels = map[string]string{v1alpha1.QueueLabel: "whatif-a"}
		createPod(t, ns, p)
		if name == "w1" {
			waitPodPhase(t, ns, "w1", corev1.PodRunning, 3*time.Minute)
		}
		time.Sleep(1100 * time.Millisecond) // creation order (seconds) is the queue's FIFO order
	}
	pending := func(ctx context.Context) (map[string]bool, error) {
		out := map[string]bool{}
		for _, name := range pods[1:] {
			p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			if gated(p) {
				out[name] = true
			}
		}
		return out, nil
	}
	waitFor(t, time.Minute, "w2..w4 held at the queue's limit", func(ctx context.Context) (bool, error) {
		g, err := pending(ctx)
		if err != nil {
			return false, err
		}
		for _, name := range pods[1:] {
			p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if !strings.Contains(admissionMessage(p), "limit 1Gi") {
				return false, fmt.Errorf("%s: gated %v, condition %q", name, g[name], admissionMessage(p))
			}
		}
		return len(g) == 3, fmt.Errorf("gated: %v", g)
	})

	// The prediction, then the change for real.
	file := filepath.Join(t.TempDir(), "new-queues.yaml")
	if err := os.WriteFile(file, []byte(queue("3Gi")), 0o644); err != nil {
		t.Fatal(err)
	}
	tessera := kubectlTessera(t)
	out, err := tessera(ctx, "what-if", "-f", file)
	if err != nil {
		t.Fatalf("kubectl tessera what-if: %v\n%s", err, out)
	}
	t.Logf("kubectl tessera what-if -f new-queues.yaml:\n%s", out)
	var predicted []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && strings.HasPrefix(f[0], ns+"/") && strings.HasSuffix(l, "-> starts") {
			predicted = append(predicted, strings.TrimPrefix(f[0], ns+"/"))
		}
	}
	slices.Sort(predicted)
	if len(predicted) == 0 {
		t.Fatalf("what-if predicts no pod of %s starts:\n%s", ns, out)
	}

	applyYAML(t, queue("3Gi"))
	waitFor(t, time.Minute, fmt.Sprintf("pods %v ungated", predicted), func(ctx context.Context) (bool, error) {
		g, err := pending(ctx)
		if err != nil {
			return false, err
		}
		return len(g) <= 3-len(predicted), fmt.Errorf("gated: %v", g)
	})
	time.Sleep(10 * time.Second) // more cycles: nothing else starts
	g, err := pending(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var started []string
	for _, name := range pods[1:] {
		if !g[name] {
			started = append(started, name)
		}
	}
	if !slices.Equal(started, predicted) {
		t.Errorf("what-if predicted %v start; applying the queues started %v", predicted, started)
	}
	for _, name := range started {
		waitPodPhase(t, ns, name, corev1.PodRunning, 2*time.Minute)
	}
}
