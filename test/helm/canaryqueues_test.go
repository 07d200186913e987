package helm

import (
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

var canaryControllerValues = valueSet{name: "canary-controller", set: []string{"--set", "controller.canary.enabled=true", "--set-string", "controller.canary.image.tag=v0.9.0-rc1",
	"--set-string", "controller.canary.controllerName=next", "--set-json", `controller.canary.args=["--reclaim=false"]`}}

// TestCanaryController: one value installs a second admission controller
// for canary queues: its own name, image, flags, ServiceAccount, lease and
// RBAC without the webhook objects; no webhooks; the admission policies
// let its ServiceAccount ungate next to the main controller's.
func TestCanaryController(t *testing.T) {
	if strings.Contains(render(t, valueSets[0]), "canary-controller") {
		t.Error("the default render has a canary controller")
	}
	objs := renderTyped(t, canaryControllerValues)
	name := controllerName + "-canary"
	c := checkSecondController(t, objs, name, "canary-controller", "--controller-name=next", "--webhook-port=0", "--reclaim=false", "--leader-elect=true", "--leader-election-id=tessera-controller-next.tessera.dev")
	cr := get[*rbacv1.ClusterRole](t, objs, "ClusterRole", name)
	for _, r := range cr.Rules {
		if slices.Contains(r.APIGroups, "admissionregistration.k8s.io") {
			t.Errorf("the canary may change webhook configurations: %v", r)
		}
	}
	role := get[*rbacv1.Role](t, objs, "Role", name)
	for _, r := range role.Rules {
		for _, res := range r.Resources {
			if res != "leases" && res != "events" {
				t.Errorf("namespaced rule %v grants more than its lease and events", r)
			}
		}
	}
	have := helpFlags(t, "./cmd/controller")
	for _, f := range argFlags(c.Args) {
		if !have[f] && f != "v" {
			t.Errorf("the canary is passed --%s, which cmd/controller does not define", f)
		}
	}
	sa := "system:serviceaccount:" + DefaultNamespace + ":" + name
	vap := get[*admissionregistrationv1.ValidatingAdmissionPolicy](t, objs, "ValidatingAdmissionPolicy", ReleaseName+"-pod-queue")
	if !strings.Contains(vap.Spec.Validations[0].Expression, sa) {
		t.Errorf("the gate policy does not let the canary ungate: %s", vap.Spec.Validations[0].Expression)
	}
	if out, err := runHelm(t, append([]string{"template", ReleaseName, ChartPath, "--kube-version", kubeVersion}, "--set", "controller.canary.enabled=true", "--set", "controller.canary.controllerName=default")...); err == nil || !strings.Contains(out+err.Error(), "main controller's name") {
		t.Errorf("controller.canary.controllerName=default: %v %s", err, out)
	}
}

// checkSecondController checks what a second controller Deployment of the
// release (the canary, the shadow) must have of its own: the arguments,
// the image tag the test values set (v0.9.0-rc1), its ServiceAccount, and
// a pod selector the main controller's (and its webhook Service's) does
// not share. It returns the controller container.
func checkSecondController(t *testing.T, objs map[string]any, name, containerName string, args ...string) corev1.Container {
	t.Helper()
	d := get[*appsv1.Deployment](t, objs, "Deployment", name)
	c := container(t, d.Spec.Template.Spec, containerName)
	for _, arg := range args {
		if !hasArg(c, arg) {
			t.Errorf("%s args %v lack %s", name, c.Args, arg)
		}
	}
	if !strings.HasSuffix(c.Image, ":v0.9.0-rc1") {
		t.Errorf("%s image %s, want its own tag", name, c.Image)
	}
	if d.Spec.Template.Spec.ServiceAccountName != name {
		t.Errorf("service account %q, want its own %q", d.Spec.Template.Spec.ServiceAccountName, name)
	}
	active := get[*appsv1.Deployment](t, objs, "Deployment", controllerName)
	if d.Spec.Selector.MatchLabels["app.kubernetes.io/component"] == active.Spec.Selector.MatchLabels["app.kubernetes.io/component"] {
		t.Errorf("%s's pods match the main controller's selector (and its webhook Service)", name)
	}
	return c
}
