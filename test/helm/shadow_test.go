package helm

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

var shadowValues = valueSet{name: "shadow", files: []string{"test/helm/testdata/shadow.values.yaml"}}

// TestShadowGolden compares the shadow controller's template with
// testdata/shadow.golden.yaml (`go test ./test/helm -update` rewrites it).
func TestShadowGolden(t *testing.T) {
	args := append([]string{"template", ReleaseName, ChartPath, "--namespace", DefaultNamespace, "--kube-version", kubeVersion,
		"--show-only", "templates/shadow-controller.yaml"}, shadowValues.args()...)
	out, err := runHelm(t, args...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	checkGolden(t, "shadow", out)
}

// TestShadowController: one value installs a second Deployment in shadow
// mode with its own ServiceAccount, lease and read-only RBAC (plus its
// report ConfigMap); nothing of it serves or configures webhooks.
func TestShadowController(t *testing.T) {
	if strings.Contains(render(t, valueSets[0]), "shadow") {
		t.Error("the default render has a shadow controller")
	}
	objs := renderTyped(t, shadowValues)
	name := controllerName + "-shadow"
	d := get[*appsv1.Deployment](t, objs, "Deployment", name)
	c := container(t, d.Spec.Template.Spec, "shadow-controller")
	for _, arg := range []string{"--shadow", "--webhook-port=0", "--reclaim=false", "--leader-election-id=" + name + ".tessera.dev", "--shadow-queues=/etc/tessera-shadow/queues.yaml"} {
		if !hasArg(c, arg) {
			t.Errorf("shadow args %v lack %s", c.Args, arg)
		}
	}
	if !strings.HasSuffix(c.Image, ":v0.9.0-rc1") {
		t.Errorf("shadow image %s, want its own tag", c.Image)
	}
	if d.Spec.Template.Spec.ServiceAccountName != name {
		t.Errorf("service account %q, want its own %q", d.Spec.Template.Spec.ServiceAccountName, name)
	}
	active := get[*appsv1.Deployment](t, objs, "Deployment", controllerName)
	if d.Spec.Selector.MatchLabels["app.kubernetes.io/component"] == active.Spec.Selector.MatchLabels["app.kubernetes.io/component"] {
		t.Error("the shadow's pods match the active controller's selector (and its webhook Service)")
	}
	cr := get[*rbacv1.ClusterRole](t, objs, "ClusterRole", name)
	for _, r := range cr.Rules {
		for _, v := range r.Verbs {
			if !slices.Contains([]string{"get", "list", "watch"}, v) {
				t.Errorf("cluster rule %v: verb %s is not read-only", r, v)
			}
		}
		for _, res := range r.Resources {
			if strings.Contains(res, "/") || res == "secrets" {
				t.Errorf("cluster rule grants %s", res)
			}
		}
	}
	role := get[*rbacv1.Role](t, objs, "Role", name)
	for _, r := range role.Rules {
		for _, res := range r.Resources {
			switch {
			case res == "leases":
			case res == "configmaps" && (slices.Equal(r.Verbs, []string{"create"}) || slices.Equal(r.ResourceNames, []string{name + "-report"})):
			default:
				t.Errorf("namespaced rule %v grants more than its lease and report", r)
			}
		}
	}
	have := helpFlags(t, "./cmd/controller")
	for _, f := range argFlags(c.Args) {
		if !have[f] && f != "v" {
			t.Errorf("the shadow is passed --%s, which cmd/controller does not define", f)
		}
	}
}
