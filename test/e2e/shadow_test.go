//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/test/helm"
	"github.com/tessera-dev/tessera/test/localcluster"
)

const (
	shadowDeployment = localcluster.ChartController + "-shadow"
	// shadowMetrics is the shadow's metrics endpoint in the local cluster
	// (deployments/helm/values/localcluster.yaml: shadow.metrics.port).
	shadowMetrics = "http://127.0.0.1:18084/metrics"
)

// kubectlTessera builds ./cmd/kubectl-tessera and returns a function that
// runs it against the cluster.
func kubectlTessera(t *testing.T) func(ctx context.Context, args ...string) (string, error) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kubectl-tessera")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "./cmd/kubectl-tessera")
	build.Dir = cluster.Opts.RepoRoot
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building kubectl-tessera: %v\n%s", err, out)
	}
	return func(ctx context.Context, args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, bin, append(args, "--kubeconfig", cluster.Kubeconfig)...).CombinedOutput()
		return string(out), err
	}
}

// metricSum sums the samples of a metric whose labels contain every one
// of want (`name="value"`), in Prometheus text format.
func metricSum(text, name string, want ...string) float64 {
	sum := 0.0
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		ok := true
		for _, w := range want {
			if !strings.Contains(l, w) {
				ok = false
			}
		}
		if f := strings.Fields(l); ok && len(f) >= 2 {
			sum += parseFloat(f[len(f)-1])
		}
	}
	return sum
}

// TestShadowController runs a shadow release (the chart's shadow.enabled)
// with a queue setting of its own (a higher limit) next to the active
// controller: `kubectl tessera shadow` shows that the shadow would admit
// the pod the active controller holds at the queue's limit; the pod stays
// gated with the active controller's reason; and the shadow's own API
// client made no PATCH or DELETE at all (pod gates, conditions, queue
// status and evictions are patches or would be refused), its guard
// refused nothing, and the API server refused it at most the Event
// controller-runtime records on election.
func TestShadowController(t *testing.T) {
	requireChart(t, "the shadow controller is a chart value (shadow.enabled): needs TESSERA_INSTALL=chart")
	usePlugin(t, defaultPlugin)
	ctx := t.Context()
	startController(t)
	applyYAML(t, `apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: shadow-a}
spec:
  resources:
    gpu.tessera.dev/memory: {quota: 1Gi, limit: 1Gi}
`)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = cluster.Kubectl(ctx, "delete", "queue", "shadow-a", "--ignore-not-found")
	})
	ns := newNamespace(t)
	createTemplate(t, ns, shareTemplate("share-1gi", "1Gi", ""))
	for _, name := range []string{"p1", "p2"} {
		p := claimPod(name, "share-1gi")
		p.Labels = map[string]string{v1alpha1.QueueLabel: "shadow-a"}
		createPod(t, ns, p)
		if name == "p1" {
			waitPodPhase(t, ns, "p1", corev1.PodRunning, 3*time.Minute)
		}
	}
	held := func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "p2", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return gated(p) && strings.Contains(admissionMessage(p), "limit 1Gi"), fmt.Errorf("gated %v, condition %q", gated(p), admissionMessage(p))
	}
	waitFor(t, time.Minute, "p2 held at shadow-a's limit by the active controller", held)

	out, err := cluster.Helm(ctx, "upgrade", helm.ReleaseName, filepath.Join(cluster.Opts.RepoRoot, helm.ChartPath),
		"--kubeconfig", cluster.Kubeconfig, "--namespace", localcluster.ChartNamespace, "--reuse-values",
		"--set", "shadow.enabled=true",
		"--set-json", `shadow.queues=[{"apiVersion":"tessera.dev/v1alpha1","kind":"Queue","metadata":{"name":"shadow-a"},"spec":{"resources":{"gpu.tessera.dev/memory":{"quota":"4Gi","limit":"4Gi"}}}}]`,
		"--timeout", "3m")
	if err != nil {
		t.Fatalf("helm upgrade --set shadow.enabled=true: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if out, err := cluster.Helm(ctx, "upgrade", helm.ReleaseName, filepath.Join(cluster.Opts.RepoRoot, helm.ChartPath),
			"--kubeconfig", cluster.Kubeconfig, "--namespace", localcluster.ChartNamespace, "--reuse-values",
			"--set", "shadow.enabled=false", "--set-json", "shadow.queues=[]", "--timeout", "3m"); err != nil {
			t.Errorf("helm upgrade --set shadow.enabled=false: %v\n%s", err, out)
		}
		_, _ = cluster.Kubectl(ctx, "delete", "configmap", "-n", localcluster.ChartNamespace, shadowDeployment+"-report", "--ignore-not-found")
	})
	waitFor(t, 2*time.Minute, "shadow Deployment available", func(ctx context.Context) (bool, error) {
		d, err := cluster.Client.AppsV1().Deployments(localcluster.ChartNamespace).Get(ctx, shadowDeployment, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return d.Status.ObservedGeneration >= d.Generation && d.Status.AvailableReplicas == 1, fmt.Errorf("status %+v", d.Status)
	})

	tessera := kubectlTessera(t)
	var report string
	waitFor(t, 3*time.Minute, "kubectl tessera shadow shows that the shadow would admit p2", func(ctx context.Context) (bool, error) {
		out, err := tessera(ctx, "shadow", "-n", localcluster.ChartNamespace)
		report = out
		if err != nil {
			return false, fmt.Errorf("%v: %s", err, out)
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "would-admit") && strings.Contains(l, "queue shadow-a") && strings.Contains(l, ns+"/p2") {
				return true, nil
			}
		}
		return false, fmt.Errorf("no would-admit line for %s/p2 in:\n%s", ns, out)
	})
	t.Logf("kubectl tessera shadow:\n%s", report)
	if strings.Contains(report, ns+"/p1") {
		t.Errorf("the report has a difference for p1, which both admit:\n%s", report)
	}
	if ok, err := held(ctx); !ok {
		t.Errorf("p2 after the shadow's cycles: %v (the shadow must not admit it)", err)
	}

	metrics, err := scrape(ctx, shadowMetrics)
	if err != nil {
		t.Fatalf("scraping the shadow's metrics at %s: %v", shadowMetrics, err)
	}
	if n := metricSum(metrics, "tessera_shadow_cycles_total"); n < 2 {
		t.Errorf("tessera_shadow_cycles_total = %v, want at least 2", n)
	}
	if n := metricSum(metrics, "tessera_shadow_refused_writes_total"); n != 0 {
		t.Errorf("tessera_shadow_refused_writes_total = %v: the shadow tried to write", n)
	}
	for _, method := range []string{"PATCH", "DELETE"} {
		if n := metricSum(metrics, "rest_client_requests_total", `method="`+method+`"`); n != 0 {
			t.Errorf("the shadow's client made %v %s requests", n, method)
		}
	}
	// controller-runtime's "became leader" Event is refused (no Event
	// RBAC): one per election.
	if n := metricSum(metrics, "rest_client_requests_total", `code="403"`); n > 2 {
		t.Errorf("the API server refused %v of the shadow's requests: it tried writes beyond its report and lease", n)
	}
	for _, l := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(l, "rest_client_requests_total") {
			t.Logf("shadow %s", l)
		}
	}
}
