package helm

import (
	"fmt"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// TestRBAC checks least privilege.
func TestRBAC(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			objs := renderTyped(t, vs)
			var all []rbacv1.PolicyRule
			for _, r := range byKind[*rbacv1.ClusterRole](objs) {
				all = append(all, r.Rules...)
				for _, rule := range r.Rules {
					for _, res := range rule.Resources {
						if res == "secrets" {
							t.Errorf("ClusterRole %s grants secrets cluster-wide", r.Name)
						}
					}
				}
			}
			for _, r := range byKind[*rbacv1.Role](objs) {
				all = append(all, r.Rules...)
				for _, rule := range r.Rules {
					for _, res := range rule.Resources {
						if res == "secrets" && len(rule.ResourceNames) == 0 {
							t.Errorf("Role %s grants all secrets of the namespace", r.Name)
						}
					}
				}
			}
			for _, rule := range all {
				for _, s := range append(append(append([]string{}, rule.Verbs...), rule.Resources...), rule.APIGroups...) {
					if s == "*" {
						t.Errorf("wildcard in rule %+v", rule)
					}
				}
			}
			plugin := get[*rbacv1.ClusterRole](t, objs, "ClusterRole", pluginName)
			want := rbacv1.PolicyRule{
				APIGroups:     []string{"resource.k8s.io"},
				Resources:     []string{"resourceclaims/driver"},
				ResourceNames: []string{"gpu.tessera.dev"},
				Verbs:         []string{"associated-node:update"},
			}
			found := false
			for _, rule := range plugin.Rules {
				if equality.Semantic.DeepEqual(rule, want) {
					found = true
				}
				for _, res := range rule.Resources {
					if res == "pods" || res == "secrets" || res == "resourceclaims/binding" {
						t.Errorf("kubelet plugin may touch %s", res)
					}
				}
				for _, v := range rule.Verbs {
					if strings.HasPrefix(v, "arbitrary-node:") {
						t.Errorf("kubelet plugin may write status of claims on other nodes: %v", rule)
					}
				}
			}
			if !found {
				t.Errorf("kubelet plugin lacks %+v", want)
			}
			ctrl := get[*rbacv1.ClusterRole](t, objs, "ClusterRole", controllerName)
			for _, rule := range ctrl.Rules {
				for _, res := range rule.Resources {
					switch res {
					case "resourceslices", "resourceclaims", "resourceclaimtemplates", "deviceclasses", "nodes":
						// Translation (the full values) makes and deletes
						// its managed templates, in a rule of their own.
						translating := res == "resourceclaimtemplates" && len(rule.Resources) == 1 && vs.name == "full"
						for _, v := range rule.Verbs {
							read := v == "get" || v == "list" || v == "watch"
							managed := translating && (v == "create" || v == "patch" || v == "delete")
							if !read && !managed {
								t.Errorf("controller may %s %s", v, res)
							}
						}
					case "mutatingwebhookconfigurations", "validatingwebhookconfigurations":
						if len(rule.ResourceNames) != 1 {
							t.Errorf("controller may change any %s: %+v", res, rule)
						}
					}
				}
			}
			// The node-pinning policy for the plugin's slice writes.
			vap := get[*admissionregistrationv1.ValidatingAdmissionPolicy](t, objs, "ValidatingAdmissionPolicy", pluginName+"-resourceslices")
			if len(vap.Spec.MatchConditions) != 1 || !strings.Contains(vap.Spec.MatchConditions[0].Expression,
				fmt.Sprintf(`"system:serviceaccount:%s:%s"`, DefaultNamespace, pluginName)) {
				t.Errorf("policy does not match the plugin's service account: %+v", vap.Spec.MatchConditions)
			}
			vars := map[string]string{}
			for _, v := range vap.Spec.Variables {
				vars[v.Name] = v.Expression
			}
			if !strings.Contains(vars["userNodeName"], "authentication.kubernetes.io/node-name") {
				t.Errorf("policy does not read the token's node claim: %v", vars)
			}
			if *vap.Spec.FailurePolicy != admissionregistrationv1.Fail {
				t.Error("policy failurePolicy is not Fail")
			}
			b := get[*admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, objs, "ValidatingAdmissionPolicyBinding", pluginName+"-resourceslices")
			if b.Spec.PolicyName != vap.Name || len(b.Spec.ValidationActions) != 1 || b.Spec.ValidationActions[0] != admissionregistrationv1.Deny {
				t.Errorf("binding %+v does not deny through %s", b.Spec, vap.Name)
			}
		})
	}
}
