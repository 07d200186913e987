package helm

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/pkg/featuregates"
)

// TestFeatureGates: every --feature-gates the chart renders names gates the
// binary knows, and the chart turns on the gates its own values need
// (mps.mode=pod, the canary and the shadow controller) unless the user
// set them.
func TestFeatureGates(t *testing.T) {
	userOff := valueSet{name: "shadow-gate-off", files: shadowValues.files, set: []string{"--set", "controller.featureGates.ShadowMode=false"}}
	want := map[string]map[string]string{ // value set -> container -> --feature-gates
		"default":           {"kubelet-plugin": "", "controller": ""},
		"full":              {"kubelet-plugin": "DynamicMIG=true,MPSDaemonPods=true", "controller": "IdleReclaim=true,TimeBasedFairShare=true"},
		"localcluster":      {"kubelet-plugin": "", "controller": "IdleReclaim=true,TimeBasedFairShare=true"},
		"canary-controller": {"controller": "", "canary-controller": "CanaryControllers=true"},
		"shadow":            {"shadow-controller": "ShadowMode=true"},
		"shadow-gate-off":   {"shadow-controller": "ShadowMode=false"},
	}
	for _, vs := range append(append([]valueSet{}, valueSets...), canaryControllerValues, shadowValues, userOff) {
		t.Run(vs.name, func(t *testing.T) {
			objs := renderTyped(t, vs)
			var pods []corev1.PodSpec
			for _, d := range byKind[*appsv1.Deployment](objs) {
				pods = append(pods, d.Spec.Template.Spec)
			}
			for _, d := range byKind[*appsv1.DaemonSet](objs) {
				pods = append(pods, d.Spec.Template.Spec)
			}
			got := map[string]string{}
			for _, spec := range pods {
				for _, c := range spec.Containers {
					gates := featuregates.Controller()
					switch {
					case len(c.Command) == 1 && c.Command[0] == "/usr/bin/controller":
					case c.Name == "kubelet-plugin":
						gates = featuregates.Plugin()
					default:
						continue
					}
					v, _ := argValue(c, "--feature-gates")
					got[c.Name] = v
					if v == "" {
						continue
					}
					if err := featuregates.New(gates).Set(v); err != nil {
						t.Errorf("container %s: --feature-gates=%s: %v", c.Name, v, err)
					}
				}
			}
			for name, w := range want[vs.name] {
				if g, ok := got[name]; !ok || g != w {
					t.Errorf("container %s: --feature-gates=%q (present %v), want %q", name, g, ok, w)
				}
			}
			if vs.name == "default" && strings.Join(keys(got), ",") == "" {
				t.Error("no controller or plugin container found")
			}
		})
	}
}
