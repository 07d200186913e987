//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/webhook"
	"github.com/tessera-dev/tessera/test/localcluster"
	"github.com/tessera-dev/tessera/test/migration"
)

// TestMigrationFixtures: with the chart's translation on
// (translation.enabled, KAI's default-queue mapped onto a Tessera queue,
// kai-scheduler moved to the default scheduler), the device-plugin, HAMi
// and KAI manifests of test/migration/fixtures, created unchanged (but
// for image and command: the local cluster has no registry) by a tenant
// with `edit` in a namespace labelled tessera.dev/translate=enabled and
// managed by a queue, each land in that queue, are admitted and charged
// what they got (annotation tessera.dev/admitted-charge), run with the
// enforcement env of their native equivalent (memory and SM limits per
// GPU), carry the translation's annotation and a Translated event; the
// untranslatable one is refused naming the field. The tenant cannot edit
// or delete a managed template, nor forge the annotation.
func TestMigrationFixtures(t *testing.T) {
	requireChart(t, "translation is served by the chart's controller")
	usePlugin(t, defaultPlugin)
	startController(t)
	ctx := t.Context()
	const queueName = "migration"
	values := map[string]any{"translation": map[string]any{"enabled": true,
		"queueNames": map[string]any{"default-queue": queueName}, "schedulerNames": []any{"kai-scheduler"}}}
	withChartValues(t, "translation.enabled", values)
	applyYAML(t, emptyQueue(queueName))
	ns := newNamespace(t)
	patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:"enabled",%q:%q}}}`, webhook.TranslateNamespaceLabel, v1alpha1.QueueLabel, queueName))
	if _, err := cluster.Client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API server sends the namespace's pods to the translating webhook
	// once its namespace informer sees the label.
	probe := busyboxPod("probe", "true")
	probe.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
	waitFor(t, 60*time.Second, "pods of "+ns+" translated", func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, probe.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && p.Annotations[webhook.TranslatedAnnotation] != "", nil
	})
	tenant := editClient(t, ns)

	for _, fx := range migration.Fixtures {
		t.Run(fx.File, func(t *testing.T) {
			p, j, err := migration.Load(fx.File)
			if err != nil {
				t.Fatal(err)
			}
			var podNames []string
			if p != nil {
				migration.Localize(&p.Spec, localcluster.BusyboxImage)
				_, err = tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
				podNames = []string{p.Name}
			} else {
				migration.Localize(&j.Spec.Template.Spec, localcluster.BusyboxImage)
				_, err = tenant.BatchV1().Jobs(ns).Create(ctx, j, metav1.CreateOptions{})
			}
			if fx.Refused != "" {
				if err == nil || !strings.Contains(err.Error(), fx.Refused) {
					t.Fatalf("created (err %v); want refused with %q", err, fx.Refused)
				}
				t.Logf("refused as expected: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("creating %s: %v", fx.File, err)
			}
			t.Cleanup(func() { deleteFixture(t, ns, p, j) })
			if j != nil {
				waitFor(t, 2*time.Minute, fmt.Sprintf("%d pods of Job %s", fx.Pods, j.Name), func(ctx context.Context) (bool, error) {
					pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + j.Name})
					if err != nil {
						return false, err
					}
					podNames = podNames[:0]
					for _, p := range pods.Items {
						podNames = append(podNames, p.Name)
					}
					return len(podNames) == fx.Pods, nil
				})
			}
			for _, name := range podNames {
				checkMigratedPod(t, ns, name, fx, queueName)
			}
		})
	}

	// The tenant cannot use translation to escape: the managed templates
	// are the controller's, the annotation the webhook's.
	list, err := cluster.Client.ResourceV1().ResourceClaimTemplates(ns).List(ctx, metav1.ListOptions{LabelSelector: webhook.ManagedTemplateLabel})
	if err != nil || len(list.Items) == 0 {
		t.Fatalf("managed templates in %s: %d (err %v)", ns, len(list.Items), err)
	}
	tmpl := list.Items[0]
	if err := tenant.ResourceV1().ResourceClaimTemplates(ns).Delete(ctx, tmpl.Name, metav1.DeleteOptions{}); err == nil || !strings.Contains(err.Error(), "translation only") {
		t.Errorf("tenant deletes managed template %s: %v, want refused", tmpl.Name, err)
	}
	unlabel := tmpl.DeepCopy()
	delete(unlabel.Labels, webhook.ManagedTemplateLabel)
	if _, err := tenant.ResourceV1().ResourceClaimTemplates(ns).Update(ctx, unlabel, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), "translation only") {
		t.Errorf("tenant unlabels managed template %s: %v, want refused", tmpl.Name, err)
	}
	forged := busyboxPod("forged", "true")
	forged.Annotations = map[string]string{webhook.TranslatedAnnotation: "nothing to see"}
	if got, err := tenant.CoreV1().Pods(ns).Create(ctx, forged, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil || got.Annotations[webhook.TranslatedAnnotation] != "" {
		t.Errorf("forged annotation: %v, annotations %v; want it removed", err, got.Annotations)
	}
}

// checkMigratedPod waits for a translated pod to run and checks its queue,
// charge, enforcement env and event.
func checkMigratedPod(t *testing.T, ns, name string, fx migration.Expect, queueName string) {
	t.Helper()
	pod := waitPodPhase(t, ns, name, corev1.PodRunning, 2*time.Minute)
	if v1alpha1.TranslatedFrom(pod.Annotations[webhook.TranslatedAnnotation]) == "" {
		t.Errorf("%s: annotation %s=%q names no system", name, webhook.TranslatedAnnotation, pod.Annotations[webhook.TranslatedAnnotation])
	}
	t.Logf("%s: %s", name, pod.Annotations[webhook.TranslatedAnnotation])
	if q := pod.Labels[v1alpha1.QueueLabel]; q != queueName {
		t.Errorf("%s: queue %q, want %s", name, q, queueName)
	}
	if pod.Spec.SchedulerName != corev1.DefaultSchedulerName {
		t.Errorf("%s: schedulerName %q", name, pod.Spec.SchedulerName)
	}
	for k := range pod.Spec.Containers[0].Resources.Limits {
		if strings.HasPrefix(string(k), "nvidia.com/") {
			t.Errorf("%s: limit %s left", name, k)
		}
	}
	// Charged exactly what it got.
	charge := pod.Annotations[v1alpha1.AdmittedChargeAnnotation]
	if fx.Whole() {
		if want := fmt.Sprintf("gpus=%d", fx.Count*1000000); !strings.Contains(charge, want) {
			t.Errorf("%s: charged %q, want %s", name, charge, want)
		}
	} else if want := fmt.Sprintf("memory=%d,", int64(fx.Count)*fx.MemMiB<<20); !strings.HasPrefix(charge, want) {
		t.Errorf("%s: charged %q, want %s...", name, charge, want)
	}
	// The enforcement env of its native equivalent.
	var env map[string]string
	waitFor(t, 30*time.Second, name+" prints its environment", func(ctx context.Context) (bool, error) {
		env = parseEnv(podLogs(t, ns, name))
		return env["NVIDIA_VISIBLE_DEVICES"] != "", nil
	})
	if uuids := strings.Split(env["NVIDIA_VISIBLE_DEVICES"], ","); len(uuids) != fx.Count {
		t.Errorf("%s: NVIDIA_VISIBLE_DEVICES=%q, want %d GPUs", name, env["NVIDIA_VISIBLE_DEVICES"], fx.Count)
	}
	if !fx.Whole() {
		// TESSERA_MEMORY_LIMIT (bytes) and TESSERA_COMPUTE_LIMIT (percent)
		// per GPU in every enforcement mode; the interposer's own
		// variables where the node runs it.
		sm := "100" // compute uncapped: work-conserving, as on KAI and HAMi without gpucores
		if fx.Cores > 0 {
			sm = fmt.Sprint(fx.Cores)
		}
		var mems, sms []string
		for i := 0; i < fx.Count; i++ {
			mems, sms = append(mems, fmt.Sprint(fx.MemMiB<<20)), append(sms, sm)
		}
		if got, want := env["TESSERA_MEMORY_LIMIT"], strings.Join(mems, ","); got != want {
			t.Errorf("%s: TESSERA_MEMORY_LIMIT=%q, want %s", name, got, want)
		}
		if got, want := env["TESSERA_COMPUTE_LIMIT"], strings.Join(sms, ","); got != want {
			t.Errorf("%s: TESSERA_COMPUTE_LIMIT=%q, want %s", name, got, want)
		}
		if env["TESSERA_MODE"] == "interposer" {
			for i := 0; i < fx.Count; i++ {
				if got, want := env[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", i)], fmt.Sprintf("%dm", fx.MemMiB); got != want {
					t.Errorf("%s: CUDA_DEVICE_MEMORY_LIMIT_%d=%q, want %s", name, i, got, want)
				}
				if got := env[fmt.Sprintf("CUDA_DEVICE_SM_LIMIT_%d", i)]; got != sm {
					t.Errorf("%s: CUDA_DEVICE_SM_LIMIT_%d=%q, want %s", name, i, got, sm)
				}
			}
		}
		t.Logf("%s: TESSERA_MODE=%s TESSERA_MEMORY_LIMIT=%s TESSERA_COMPUTE_LIMIT=%s", name, env["TESSERA_MODE"], env["TESSERA_MEMORY_LIMIT"], env["TESSERA_COMPUTE_LIMIT"])
	}
	waitFor(t, time.Minute, name+"'s Translated event", func(ctx context.Context) (bool, error) {
		evs, err := cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=Translated"})
		if err != nil {
			return false, err
		}
		return len(evs.Items) > 0, nil
	})
}

// parseEnv reads NAME=value lines.
func parseEnv(log string) map[string]string {
	out := map[string]string{}
	for _, l := range strings.Split(log, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok {
			out[k] = v
		}
	}
	return out
}

// deleteFixture deletes a fixture's pod or Job and waits for its pods to
// go, so that the next fixture finds the GPUs free.
func deleteFixture(t *testing.T, ns string, p *corev1.Pod, j *batchv1.Job) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	grace := int64(1)
	bg := metav1.DeletePropagationBackground
	opts := metav1.DeleteOptions{GracePeriodSeconds: &grace, PropagationPolicy: &bg}
	if p != nil {
		_ = cluster.Client.CoreV1().Pods(ns).Delete(ctx, p.Name, opts)
	}
	if j != nil {
		_ = cluster.Client.BatchV1().Jobs(ns).Delete(ctx, j.Name, opts)
		_ = cluster.Client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &grace}, metav1.ListOptions{LabelSelector: "job-name=" + j.Name})
	}
	for ctx.Err() == nil {
		pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		claims, cerr := cluster.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err == nil && cerr == nil && len(pods.Items) == 0 && len(claims.Items) == 0 {
			return
		}
		if err != nil && !apierrors.IsNotFound(err) {
			t.Logf("waiting for the fixture's pods to go: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Errorf("the fixture's pods or claims in %s did not go within 2m", ns)
}

// TestDevicePluginNameServedByDRA: where the device plugin is gone, the
// chart maps nvidia.com/gpu onto the whole-GPU class
// (deviceClasses.extendedResourceName, no translation): the device
// plugin's own manifest, created unchanged (image and command aside) by a
// tenant in a namespace managed by a queue, is gated into that queue,
// admitted and charged one GPU, and the scheduler serves it through DRA
// (status.extendedResourceClaimStatus names the claim it made) on the
// local node, which advertises no nvidia.com/gpu.
func TestDevicePluginNameServedByDRA(t *testing.T) {
	requireChart(t, "the DeviceClasses come with the chart")
	usePlugin(t, defaultPlugin)
	startController(t)
	ctx := t.Context()
	const queueName = "device-plugin"
	values := map[string]any{"deviceClasses": map[string]any{"extendedResourceName": map[string]any{"enabled": true, "name": "nvidia.com/gpu"}}}
	withChartValues(t, "deviceClasses.extendedResourceName nvidia.com/gpu", values)
	applyYAML(t, emptyQueue(queueName))
	ns := newNamespace(t)
	patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, v1alpha1.QueueLabel, queueName))
	if _, err := cluster.Client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	tenant := editClient(t, ns)
	p, _, err := migration.Load("device-plugin/gpu-pod.yaml")
	if err != nil {
		t.Fatal(err)
	}
	migration.Localize(&p.Spec, localcluster.BusyboxImage)
	created, err := tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating the device plugin's gpu-pod: %v", err)
	}
	if created.Labels[v1alpha1.QueueLabel] != queueName || len(created.Spec.SchedulingGates) == 0 {
		t.Errorf("gpu-pod: queue %q, gates %v; want queue %s and the admission gate", created.Labels[v1alpha1.QueueLabel], created.Spec.SchedulingGates, queueName)
	}
	pod := waitPodPhase(t, ns, p.Name, corev1.PodRunning, 2*time.Minute)
	if st := pod.Status.ExtendedResourceClaimStatus; st == nil || st.ResourceClaimName == "" {
		t.Errorf("gpu-pod: no extendedResourceClaimStatus: the scheduler did not serve nvidia.com/gpu through DRA")
	} else {
		claim, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, st.ResourceClaimName, metav1.GetOptions{})
		if err != nil || len(claim.Spec.Devices.Requests) != 1 || claim.Spec.Devices.Requests[0].Exactly == nil || claim.Spec.Devices.Requests[0].Exactly.DeviceClassName != "gpu.tessera.dev" {
			t.Errorf("gpu-pod's claim %s: %v %+v; want one request of gpu.tessera.dev", st.ResourceClaimName, err, claim)
		}
	}
	if charge := pod.Annotations[v1alpha1.AdmittedChargeAnnotation]; !strings.Contains(charge, "gpus=1000000") {
		t.Errorf("gpu-pod charged %q, want one GPU", charge)
	}
	var env map[string]string
	waitFor(t, 30*time.Second, "gpu-pod prints its environment", func(ctx context.Context) (bool, error) {
		env = parseEnv(podLogs(t, ns, p.Name))
		return env["NVIDIA_VISIBLE_DEVICES"] != "", nil
	})
	if uuids := strings.Split(env["NVIDIA_VISIBLE_DEVICES"], ","); len(uuids) != 1 || !strings.HasPrefix(uuids[0], "GPU-") {
		t.Errorf("gpu-pod: NVIDIA_VISIBLE_DEVICES=%q, want one GPU", env["NVIDIA_VISIBLE_DEVICES"])
	}
}
