package helm

import (
	"slices"
	"strings"
	"testing"

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
	c := checkSecondController(t, objs, name, "shadow-controller", "--shadow", "--webhook-port=0", "--reclaim=false", "--leader-election-id="+name+".tessera.dev", "--shadow-queues=/etc/tessera-shadow/queues.yaml")
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
