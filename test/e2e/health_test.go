//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
	"github.com/tessera-dev/tessera/pkg/node/health"
	"github.com/tessera-dev/tessera/test/localcluster"
)

// TestDeviceHealthTaints: a GPU fault taints the device by cause, an
// application XID only informs, the taint goes once the GPU answers again,
// and the controller's admission honours device taints and an admin's
// DeviceTaintRule as the scheduler does: a queued pod that could only run
// on tainted devices stays gated (never ungated onto devices the scheduler
// then refuses) and is admitted once the taint is gone.
//
// Faults come from the mock NVML's inject file in the plugin's data
// directory (nvmlmock.InjectFileName), which the plugin polls.
func TestDeviceHealthTaints(t *testing.T) {
	usePlugin(t, localcluster.PluginConfig{Profile: localcluster.DefaultProfile, Args: []string{"--health-recovery-hold-down=5s"}})
	ctx := t.Context()
	startController(t)
	dataDir := filepath.Join(localcluster.KubeletRootDir, "plugins", localcluster.DriverName)
	if _, err := os.Stat(dataDir); err != nil {
		t.Fatalf("the plugin's data directory: %v", err)
	}
	inject := func(line string) {
		t.Helper()
		f, err := os.OpenFile(filepath.Join(dataDir, nvmlmock.InjectFileName), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fmt.Fprintln(f, line); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { inject("0 recover") })
	// taints reads a device's taints from this node's slices.
	taints := func(ctx context.Context, device string) ([]resourceapi.DeviceTaint, error) {
		list, err := cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		for _, s := range list.Items {
			if s.Spec.Driver != localcluster.DriverName {
				continue
			}
			for _, d := range s.Spec.Devices {
				if d.Name == device {
					return d.Taints, nil
				}
			}
		}
		return nil, fmt.Errorf("no device %s published", device)
	}
	hasTaint := func(device, key string, effect resourceapi.DeviceTaintEffect) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			ts, err := taints(ctx, device)
			if err != nil {
				return false, err
			}
			for _, tt := range ts {
				if tt.Key == key {
					if tt.Effect != effect || tt.TimeAdded == nil {
						return false, fmt.Errorf("%s: taint %s has effect %s (time added %v), want %s", device, key, tt.Effect, tt.TimeAdded, effect)
					}
					return true, nil
				}
			}
			return false, fmt.Errorf("%s taints: %+v", device, ts)
		}
	}

	// A fatal fault (XID 79, the GPU fell off the bus) and an application XID.
	inject("0 79")
	inject("1 13")
	waitFor(t, time.Minute, "gpu-0 tainted as lost", hasTaint("gpu-0", health.KeyGPULost, resourceapi.DeviceTaintEffectNoSchedule))
	waitFor(t, time.Minute, "gpu-1 with an informational taint", hasTaint("gpu-1", health.KeyAppXID, resourceapi.DeviceTaintEffectNone))

	queue := "health-e2e"
	applyYAML(t, fmt.Sprintf("apiVersion: tessera.dev/v1alpha1\nkind: Queue\nmetadata: {name: %s}\nspec: {}\n", queue))
	ns := newNamespace(t)
	whole := func(name string, count int64) *resourceapi.ResourceClaimTemplate {
		return &resourceapi.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
				Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
					DeviceClassName: localcluster.DriverName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count,
				}}},
			}}},
		}
	}
	createTemplate(t, ns, whole("two-gpus", 2))
	createTemplate(t, ns, whole("one-gpu", 1))
	queued := func(name, template string) {
		t.Helper()
		p := claimPod(name, template)
		p.Labels = map[string]string{v1alpha1.QueueLabel: queue}
		createPod(t, ns, p)
	}
	// stillGated checks the pod waits for its queue, says why, and is not
	// ungated for a while.
	stillGated := func(name string) {
		t.Helper()
		var why string
		waitFor(t, time.Minute, name+" told why it waits", func(ctx context.Context) (bool, error) {
			p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if !gated(p) {
				t.Fatalf("pod %s was ungated although it fits only tainted devices", name)
			}
			for _, c := range p.Status.Conditions {
				if c.Type == v1alpha1.AdmissionCondition && c.Status == corev1.ConditionFalse {
					why = c.Reason + ": " + c.Message
					return true, nil
				}
			}
			return false, nil
		})
		t.Logf("%s waits: %s", name, why)
		time.Sleep(10 * time.Second)
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !gated(p) {
			t.Fatalf("pod %s was ungated although it fits only tainted devices", name)
		}
	}

	// Two whole GPUs: gpu-0 is NoSchedule, gpu-1's taint is informational.
	queued("two", "two-gpus")
	stillGated("two")

	// The GPU answers again: after the hold-down the taint is gone and the
	// pod is admitted and runs.
	inject("0 recover")
	waitFor(t, time.Minute, "gpu-0's taint cleared", func(ctx context.Context) (bool, error) {
		ts, err := taints(ctx, "gpu-0")
		if err != nil {
			return false, err
		}
		for _, tt := range ts {
			if tt.Key == health.KeyGPULost {
				return false, fmt.Errorf("still tainted: %+v", tt)
			}
		}
		return true, nil
	})
	waitPodPhase(t, ns, "two", corev1.PodRunning, 2*time.Minute)
	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, "two", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitClaimsUnprepared(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}

	// An admin's DeviceTaintRule over every device of the driver on this
	// node: the scheduler would refuse them, so the controller holds the pod.
	rule := &resourceapi.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-health-maintenance"},
		Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr.To(localcluster.DriverName)},
			Taint:          resourceapi.DeviceTaint{Key: "example.com/maintenance", Value: "e2e", Effect: resourceapi.DeviceTaintEffectNoSchedule},
		},
	}
	if _, err := cluster.Client.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the DeviceTaintRule: %v", err)
	}
	ruleGone := false
	t.Cleanup(func() {
		if !ruleGone {
			_ = cluster.Client.ResourceV1().DeviceTaintRules().Delete(context.Background(), rule.Name, metav1.DeleteOptions{})
		}
	})
	queued("one", "one-gpu")
	stillGated("one")
	if err := cluster.Client.ResourceV1().DeviceTaintRules().Delete(ctx, rule.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ruleGone = true
	waitPodPhase(t, ns, "one", corev1.PodRunning, 2*time.Minute)
}
