//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tessera-dev/tessera/test/localcluster"
)

// newNamespace creates a fresh namespace for one test and deletes it (and
// waits for its pods to go, so their claims are unprepared) when the test ends.
func newNamespace(t *testing.T) string {
	t.Helper()
	ctx := t.Context()
	ns, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-" + strings.ToLower(sanitize(t.Name())) + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	// The ServiceAccount controller must have made "default" before pods are admitted.
	waitFor(t, 30*time.Second, "default ServiceAccount in "+ns.Name, func(ctx context.Context) (bool, error) {
		_, err := cluster.Client.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		grace := int64(2)
		_ = cluster.Client.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &grace}, metav1.ListOptions{})
		// untilNone polls until list finds nothing (or the cleanup's time is up).
		untilNone := func(list func() (int, error)) {
			for ctx.Err() == nil {
				if n, err := list(); err == nil && n == 0 {
					return
				}
				time.Sleep(250 * time.Millisecond)
			}
		}
		untilNone(func() (int, error) {
			pods, err := cluster.Client.CoreV1().Pods(ns.Name).List(ctx, metav1.ListOptions{})
			if err != nil {
				return 0, err
			}
			return len(pods.Items), nil
		})
		// The claims the pods' templates made go with the pods, but
		// asynchronously; a claim the test created itself stays until it
		// is deleted (waiting for it to go by itself spent this cleanup's
		// whole 90 s). Delete them all and wait until they are gone, so
		// that the next test starts with every device free: a claim still
		// allocated takes capacity that test counts on (the scheduler
		// retries once the claim is gone, after a backoff that eats into
		// the test's timeouts).
		_ = cluster.Client.ResourceV1().ResourceClaims(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		untilNone(func() (int, error) {
			claims, err := cluster.Client.ResourceV1().ResourceClaims(ns.Name).List(ctx, metav1.ListOptions{})
			if err != nil {
				return 0, err
			}
			return len(claims.Items), nil
		})
		_ = cluster.Client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

// exemptNamespace is newNamespace labelled tessera.dev/sandbox=exempt, as
// a cluster administrator exempts a namespace from Tessera's sandbox
// (docs/security.md, "The sandbox"): for tests whose pods mount host
// files or run unconfined on purpose.
func exemptNamespace(t *testing.T) string {
	t.Helper()
	ns := newNamespace(t)
	patch := []byte(`{"metadata":{"labels":{"tessera.dev/sandbox":"exempt"}}}`)
	if _, err := cluster.Client.CoreV1().Namespaces().Patch(t.Context(), ns, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("exempting namespace %s from the sandbox: %v", ns, err)
	}
	// The API server's policies see the label once its namespace informer
	// does: wait until a claim pod in the host's network passes.
	probe := busyboxPod("exempt-probe", "true")
	probe.Spec.HostNetwork = true
	probe.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: new("none")}}
	waitFor(t, 30*time.Second, "namespace "+ns+" exempt from the sandbox", func(ctx context.Context) (bool, error) {
		_, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, probe.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, err
	})
	return ns
}

func sanitize(s string) string {
	var sb strings.Builder
	for _, r := range s {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			sb.WriteRune(r)
		} else {
			sb.WriteByte('-')
		}
	}
	out := sb.String()
	if len(out) > 40 {
		out = out[:40]
	}
	return strings.Trim(out, "-")
}

// busyboxPod is a pod running command in the local busybox image. The image
// is never pulled (imagePullPolicy Never): the network rule forbids it.
func busyboxPod(name string, command ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64(1)),
			Containers: []corev1.Container{{
				Name:            "main",
				Image:           localcluster.BusyboxImage,
				ImagePullPolicy: corev1.PullNever,
				Command:         command,
			}},
		},
	}
}

// sameContainerRunning says whether now is still the pod it was before,
// running the same container with no restart: what "undisturbed" means.
func sameContainerRunning(before, now *corev1.Pod) bool {
	b, n := before.Status.ContainerStatuses, now.Status.ContainerStatuses
	return now.UID == before.UID && now.Status.Phase == corev1.PodRunning && len(b) == 1 && len(n) == 1 &&
		n[0].State.Running != nil && n[0].ContainerID == b[0].ContainerID && n[0].RestartCount == 0
}

// waitFor polls check every 250ms until it returns true or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, check func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	var lastErr error
	for {
		ok, err := check(ctx)
		if ok {
			return
		}
		if err != nil {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, what, lastErr)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// waitPodPhase waits until the pod reaches phase and returns it; a pod that
// ends in another terminal phase fails the test at once.
func waitPodPhase(t *testing.T, ns, name string, phase corev1.PodPhase, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	waitFor(t, timeout, fmt.Sprintf("pod %s/%s %s", ns, name, phase), func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		if p.Status.Phase != phase && (p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded) {
			t.Fatalf("pod %s/%s ended %s, want %s: %+v", ns, name, p.Status.Phase, phase, p.Status)
		}
		return p.Status.Phase == phase, nil
	})
	return pod
}

// podLogs reads a container's log through the API server (which fetches it
// from the kubelet on 127.0.0.1).
func podLogs(t *testing.T, ns, name string) string {
	t.Helper()
	log, err := readLog(t.Context(), ns, name)
	if err != nil {
		t.Fatalf("logs of %s/%s: %v", ns, name, err)
	}
	return log
}

func readLog(ctx context.Context, ns, name string) (string, error) {
	b, err := cluster.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	return string(b), err
}

// logThrough waits until the container's log has a line marker (the
// container prints it once it has printed what the test reads) and returns
// the log.
func logThrough(t *testing.T, ns, name, marker string) string {
	t.Helper()
	var log string
	waitFor(t, time.Minute, "the log of "+ns+"/"+name+" through "+marker, func(ctx context.Context) (bool, error) {
		var err error
		log, err = readLog(ctx, ns, name)
		return err == nil && strings.Contains(log, "\n"+marker+"\n"), err
	})
	return log
}

// requireChart skips a test whose subject exists only when Tessera is
// installed by its Helm chart (TESSERA_INSTALL=chart, the default; why
// says what it needs of the chart). make test installs the chart, and
// hack/noskip fails that run on any skip .ci/allowed-skips does not name,
// so this skip fires only in a host-mode run someone asked for.
func requireChart(t *testing.T, why string) {
	t.Helper()
	if !cluster.ChartMode() {
		t.Skip("needs TESSERA_INSTALL=chart: " + why)
	}
}

// startController starts Tessera's controller (or makes sure it runs).
func startController(t *testing.T) {
	t.Helper()
	setupMu.Lock()
	defer setupMu.Unlock()
	if err := cluster.StartController(t.Context()); err != nil {
		t.Fatalf("starting the controller: %v", err)
	}
}

// setupMu serializes the calls that change the cluster's shared set-up
// (the kubelet plugin's configuration, the controller): the tests of the
// parallel group reach them together.
var setupMu sync.Mutex

// inParallel runs the rest of t beside the other tests of the parallel
// group, on the default plugin configuration with the controller running.
// go test starts a top-level test that calls t.Parallel only after every
// other top-level test has ended, so the group runs last and alone, and
// `make e2e` lets all of it run at once (-parallel).
//
// Most tests here wait on the cluster (an idle window, a pod's run, an
// admission cycle), so the group saves their waits. A test joins it only
// when it changes nothing shared (no plugin configuration of its own, no
// chart values, no controller flags), uses queues and namespaces of its
// own, asserts nothing about free capacity or placement, and asks small
// shares: the group's shares together (TestIdleReclaim 2 x 4Gi,
// TestUsageReport 4Gi + 2Gi, TestHostileAdmission at most 2Gi) fit the
// default profile's two T4s however they are packed.
func inParallel(t *testing.T) {
	t.Helper()
	t.Parallel()
	usePlugin(t, defaultPlugin)
	startController(t)
}

// requirePlugin skips a test that needs the Tessera kubelet plugin when the
// cluster runs without it (./cmd/kubelet-plugin not written yet, or
// TESSERA_PLUGIN=off).
func requirePlugin(t *testing.T) {
	t.Helper()
	if !cluster.PluginRunning() {
		t.Skip("the Tessera kubelet plugin is not running in this cluster")
	}
}

// editClient acts in namespace ns as a namespace user with the built-in
// `edit` role: a ServiceAccount "tenant" bound to it, through impersonation.
func editClient(t *testing.T, ns string) kubernetes.Interface {
	t.Helper()
	ctx := t.Context()
	if _, err := cluster.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant-edit"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "tenant", Namespace: ns}},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "edit"},
	}
	if _, err := cluster.Client.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", cluster.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Impersonate.UserName = "system:serviceaccount:" + ns + ":tenant"
	cfg.Impersonate.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The API server's authorizer learns of the RoleBinding through its
	// own watch: on a busy machine a request right after the create can
	// still be forbidden. Wait until the tenant itself may create what the
	// tests create as it (a claim template is one of them).
	waitFor(t, time.Minute, "the edit role bound to "+ns+"/tenant", func(ctx context.Context) (bool, error) {
		r, err := c.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: "create", Group: "resource.k8s.io", Resource: "resourceclaimtemplates",
			}},
		}, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed, err
	})
	return c
}

// applyYAML applies manifests as the cluster's admin and deletes them when
// the test ends.
func applyYAML(t *testing.T, manifests string) {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "manifests-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(manifests); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if out, err := cluster.Kubectl(t.Context(), "apply", "-f", f.Name()); err != nil {
		t.Fatalf("applying manifests: %v: %s", err, out)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = cluster.Kubectl(ctx, "delete", "-f", f.Name(), "--ignore-not-found")
	})
}

// withChartValues upgrades the chart with values (what names them in
// errors) for the rest of the test, and back to the defaults at its end.
func withChartValues(t *testing.T, what string, values map[string]any) {
	t.Helper()
	if err := cluster.UpgradeChart(t.Context(), defaultPlugin, values); err != nil {
		t.Fatalf("helm upgrade with %s: %v", what, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := cluster.UpgradeChart(ctx, defaultPlugin, nil); err != nil {
			t.Errorf("helm upgrade without %s: %v", what, err)
		}
	})
}

// emptyQueue is the manifest of a Queue without limits.
func emptyQueue(name string) string {
	return "apiVersion: tessera.dev/v1alpha1\nkind: Queue\nmetadata:\n  name: " + name + "\nspec: {}\n"
}
