package helm

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/test/testutil"
)

func nvidiaPod(name string, env ...corev1.EnvVar) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "nvidia/cuda", Env: env}},
			SecurityContext: runtimeDefault()},
	}
}

// testNvidiaVisibleDevices: policy <release>-nvidia-visible-devices.
func testNvidiaVisibleDevices(t *testing.T, ctx context.Context, admin, tenant kubernetes.Interface) {
	t.Helper()
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	const why = "sets NVIDIA_VISIBLE_DEVICES: on a node whose NVIDIA container runtime runs in legacy mode"
	testutil.Eventually(t, 60*time.Second, "policy nvidia-visible-devices loaded", func() error {
		_, err := tenant.CoreV1().Pods("team-a").Create(ctx, nvidiaPod("probe", corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}), dry)
		if err != nil && strings.Contains(err.Error(), why) {
			return nil
		}
		return fmt.Errorf("NVIDIA_VISIBLE_DEVICES=all: %v", err)
	})
	all := corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}
	for _, tc := range []struct {
		name string
		pod  func(p *corev1.Pod)
		want string // "" = allowed
	}{
		{"NVIDIA_VISIBLE_DEVICES=all in a claim-less container", func(p *corev1.Pod) { p.Spec.Containers[0].Env = []corev1.EnvVar{all} }, "container main " + why},
		{"a GPU UUID", func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "GPU-0f3e"}}
		}, "remove it (only void or none are allowed) and ask for a GPU with a ResourceClaim"},
		{"in an init container", func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "nvidia/cuda", Env: []corev1.EnvVar{all}}}
		}, "container init " + why},
		{"in a container that uses a claim", func(p *corev1.Pod) {
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu")}}
			p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
			p.Spec.Containers[0].Env = []corev1.EnvVar{all}
		}, "container main " + why},
		{"from a ConfigMap key", func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Key: "k"}}}}
		}, why},
		{"envFrom prefix NVIDIA_", func(p *corev1.Pod) {
			p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{Prefix: "NVIDIA_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}}
		}, "has an envFrom prefix that can make NVIDIA_VISIBLE_DEVICES"},
		{"device list as a volume mount", func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "v", MountPath: "/var/run/nvidia-container-devices/all"}}
		}, "mounts a volume under /var/run/nvidia-container-devices"},
		{"void", func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}}
		}, ""},
		{"none", func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "none"}}
		}, ""},
		{"NVIDIA_DRIVER_CAPABILITIES", func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_DRIVER_CAPABILITIES", Value: "all"}}
		}, ""},
		{"an unrelated envFrom prefix", func(p *corev1.Pod) {
			p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{Prefix: "APP_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}}
		}, ""},
	} {
		p := nvidiaPod("nv")
		tc.pod(p)
		_, err := tenant.CoreV1().Pods("team-a").Create(ctx, p, dry)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v, want allowed", tc.name, err)
			}
		} else if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want refused with %q", tc.name, err, tc.want)
		}
	}
	// The release's namespace and kube-system (exemptNamespaces) are left out.
	for _, ns := range []string{DefaultNamespace, "kube-system"} {
		// No kube-controller-manager here makes the default service account.
		if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		if _, err := admin.CoreV1().Pods(ns).Create(ctx, nvidiaPod("nv", all), dry); err != nil {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=all in namespace %s: %v, want allowed (left out)", ns, err)
		}
	}
	// An ephemeral container (kubectl debug) is checked on
	// pods/ephemeralcontainers; the pod's existing containers are not
	// checked again.
	p, err := admin.CoreV1().Pods("team-a").Create(ctx, nvidiaPod("debugme"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "nvidia/cuda", Env: []corev1.EnvVar{all}}}}
	_, err = admin.CoreV1().Pods("team-a").UpdateEphemeralContainers(ctx, "debugme", p.DeepCopy(), metav1.UpdateOptions{})
	if err == nil || !strings.Contains(err.Error(), "container debug "+why) {
		t.Errorf("an ephemeral container with NVIDIA_VISIBLE_DEVICES=all: %v, want refused", err)
	}
	p.Spec.EphemeralContainers[0].Env = nil
	if _, err := admin.CoreV1().Pods("team-a").UpdateEphemeralContainers(ctx, "debugme", p.DeepCopy(), metav1.UpdateOptions{}); err != nil {
		t.Errorf("an ephemeral container without it: %v, want allowed", err)
	}
}

// TestNvidiaVisibleDevicesValues renders the NVIDIA_VISIBLE_DEVICES policy
// with its values: on by default, leaving out the release's namespace and
// exemptNamespaces; off with its own switch or with every policy.
func TestNvidiaVisibleDevicesValues(t *testing.T) {
	const name = "tessera-nvidia-visible-devices"
	excluded := func(objs map[string]any) []string {
		vap := get[*admissionregistrationv1.ValidatingAdmissionPolicy](t, objs, "ValidatingAdmissionPolicy", name)
		get[*admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, objs, "ValidatingAdmissionPolicyBinding", name)
		if *vap.Spec.FailurePolicy != admissionregistrationv1.Fail {
			t.Error("failurePolicy is not Fail")
		}
		sel := vap.Spec.MatchConstraints.NamespaceSelector
		if sel == nil || len(sel.MatchExpressions) != 1 || sel.MatchExpressions[0].Key != "kubernetes.io/metadata.name" || sel.MatchExpressions[0].Operator != metav1.LabelSelectorOpNotIn {
			t.Fatalf("namespaceSelector %+v", sel)
		}
		return sel.MatchExpressions[0].Values
	}
	if got := excluded(renderTyped(t, valueSet{name: "default"})); strings.Join(got, ",") != DefaultNamespace+",kube-system" {
		t.Errorf("default: left out %v, want the release's namespace and kube-system", got)
	}
	if got := excluded(renderTyped(t, valueSet{name: "exempt", set: []string{"--set", "admissionPolicies.nvidiaVisibleDevices.exemptNamespaces={gpu-operator," + DefaultNamespace + "}"}})); strings.Join(got, ",") != DefaultNamespace+",gpu-operator" {
		t.Errorf("exemptNamespaces gpu-operator: left out %v", got)
	}
	for _, set := range []string{"admissionPolicies.nvidiaVisibleDevices.enabled=false", "admissionPolicies.enabled=false"} {
		objs := renderTyped(t, valueSet{name: set, set: []string{"--set", set}})
		for _, k := range []string{"ValidatingAdmissionPolicy/" + name, "ValidatingAdmissionPolicyBinding/" + name} {
			if _, ok := objs[k]; ok {
				t.Errorf("%s: %s rendered", set, k)
			}
		}
	}
	if _, err := runHelm(t, "template", ReleaseName, ChartPath, "--kube-version", kubeVersion, "--set", "admissionPolicies.nvidiaVisibleDevices.exemptNamespaces={Not_A_Name}"); err == nil || !strings.Contains(err.Error(), "exemptNamespaces") {
		t.Errorf("an exempt namespace that is no namespace name: %v, want an error naming exemptNamespaces", err)
	}
}
