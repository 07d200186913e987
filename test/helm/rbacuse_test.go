package helm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/test/testutil"
	rbacv1 "k8s.io/api/rbac/v1"
)

// apiUse is one grant a component needs: API group, resource (with
// subresource) and verb.
type apiUse struct{ group, resource, verb string }

func (u apiUse) String() string { return fmt.Sprintf("%s %s/%s", u.verb, u.group, u.resource) }

// Every API call the controller and the kubelet plugin make in the chart's
// mode (webhooks patched with a self-signed CA, MPS daemon pods), with the
// code that makes it. TestRBACMatchesCode holds the chart's ClusterRoles and
// Roles to exactly this table, both ways, and the code's typed clientset
// calls to it: a new grant needs its call here, a new call its grant.
var apiUses = map[string]map[apiUse]string{
	"kubelet-plugin": {
		{"resource.k8s.io", "resourceslices", "get"}:                           "kubeletplugin library: ResourceSlice controller",
		{"resource.k8s.io", "resourceslices", "list"}:                          "kubeletplugin library: ResourceSlice informer",
		{"resource.k8s.io", "resourceslices", "watch"}:                         "kubeletplugin library: ResourceSlice informer",
		{"resource.k8s.io", "resourceslices", "create"}:                        "kubeletplugin library: publishes this node's slices",
		{"resource.k8s.io", "resourceslices", "update"}:                        "kubeletplugin library: publishes this node's slices",
		{"resource.k8s.io", "resourceslices", "patch"}:                         "kubeletplugin library: publishes this node's slices",
		{"resource.k8s.io", "resourceslices", "delete"}:                        "kubeletplugin library: removes stale slices",
		{"resource.k8s.io", "resourceclaims", "get"}:                           "kubeletplugin library (prepare) and pkg/node/plugin (repair after a lost checkpoint)",
		{"resource.k8s.io", "resourceclaims/status", "update"}:                 "pkg/node/plugin status.go: UpdateStatus of status.devices",
		{"resource.k8s.io", "resourceclaims/driver", "associated-node:update"}: "the API server's granular check of the status update above",
		{"", "nodes", "get"}:                                                   "pkg/node/plugin, pkg/node/coexist: the Node's UID and allocatable",
		{"", "events", "create"}:                                               "pkg/node/coexist: a Warning Event per GPU left unpublished",
		{"", "pods", "get"}:                                                    "pkg/node/mpspod: adopt a claim's daemon pod",
		{"", "pods", "create"}:                                                 "pkg/node/mpspod: a claim's daemon pod",
		{"", "pods", "delete"}:                                                 "pkg/node/mpspod: the daemon pod at unprepare",
	},
	"controller": {
		{"", "pods", "get"}:                        "cache (labelled pods)",
		{"", "pods", "list"}:                       "cache (labelled pods)",
		{"", "pods", "watch"}:                      "cache (labelled pods)",
		{"", "pods", "patch"}:                      "apply.go: ungate, node pins",
		{"", "pods/status", "patch"}:               "apply.go, idle.go: pod conditions",
		{"", "pods/eviction", "create"}:            "evict.go: reclaim, idle reclaim, stale pins",
		{"", "pods", "delete"}:                     "evict.go: reclaim past a budget (controller.reclaimPastBudgets)",
		{"", "events", "create"}:                   "controller-runtime: leader-election events",
		{"", "events", "patch"}:                    "controller-runtime: leader-election events",
		{"events.k8s.io", "events", "create"}:      "the manager's event recorder",
		{"events.k8s.io", "events", "patch"}:       "the manager's event recorder (series)",
		{"", "nodes", "get"}:                       "cache: the admission simulation",
		{"", "nodes", "list"}:                      "cache: the admission simulation",
		{"", "nodes", "watch"}:                     "cache: the admission simulation",
		{"", "namespaces", "get"}:                  "cache: pod webhook and queue namespace selectors",
		{"", "namespaces", "list"}:                 "cache: pod webhook and queue namespace selectors",
		{"", "namespaces", "watch"}:                "cache: pod webhook and queue namespace selectors",
		{"tessera.dev", "queues", "get"}:           "cache; Queue webhook",
		{"tessera.dev", "queues", "list"}:          "cache; Queue webhook",
		{"tessera.dev", "queues", "watch"}:         "cache",
		{"tessera.dev", "queues/status", "update"}: "apply.go: Queue status",
		{"tessera.dev", "queues/status", "patch"}:  "history.go: status.usage",
		{"admissionregistration.k8s.io", "mutatingwebhookconfigurations", "get"}:      "pkg/control/webhook config.go: caBundle (direct client)",
		{"admissionregistration.k8s.io", "mutatingwebhookconfigurations", "update"}:   "pkg/control/webhook config.go: caBundle",
		{"admissionregistration.k8s.io", "validatingwebhookconfigurations", "get"}:    "pkg/control/webhook config.go: caBundle (direct client)",
		{"admissionregistration.k8s.io", "validatingwebhookconfigurations", "update"}: "pkg/control/webhook config.go: caBundle",
		{"coordination.k8s.io", "leases", "get"}:                                      "controller-runtime leader election (LeaseLock)",
		{"coordination.k8s.io", "leases", "create"}:                                   "controller-runtime leader election (LeaseLock)",
		{"coordination.k8s.io", "leases", "update"}:                                   "controller-runtime leader election (LeaseLock)",
		{"", "secrets", "get"}:    "pkg/control/webhook certs.go: the CA Secret (direct client)",
		{"", "secrets", "update"}: "pkg/control/webhook certs.go: fill the chart's empty Secret",
		// translation.enabled (the full values).
		{"resource.k8s.io", "resourceclaimtemplates", "create"}: "pkg/control/webhook translate_handler.go: managed templates",
		{"resource.k8s.io", "resourceclaimtemplates", "patch"}:  "pkg/control/webhook translate_handler.go: marks a managed template used",
		{"resource.k8s.io", "resourceclaimtemplates", "delete"}: "pkg/control/controller translation.go: unused managed templates",
	},
}

func init() {
	// The DRA read-only resources, by the cache and the claim webhook.
	for _, r := range []string{"resourceclaims", "resourceclaimtemplates", "resourceslices", "deviceclasses", "devicetaintrules"} {
		for _, v := range []string{"get", "list", "watch"} {
			apiUses["controller"][apiUse{"resource.k8s.io", r, v}] = "cache: the admission simulation; claim webhook"
		}
	}
}

// roleNames are the component's ClusterRoles and Roles in the chart.
var roleNames = map[string][]string{
	"kubelet-plugin": {"ClusterRole/" + pluginName, "Role/" + pluginName + "-mps-daemons"},
	"controller":     {"ClusterRole/" + controllerName, "Role/" + controllerName},
}

// grants expands rules into (group, resource, verb).
func grants(rules []rbacv1.PolicyRule) map[apiUse]bool {
	out := map[apiUse]bool{}
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out[apiUse{g, res, v}] = true
				}
			}
		}
	}
	return out
}

func TestRBACMatchesCode(t *testing.T) {
	// The default values (self-signed webhooks) and the full ones (MPS
	// daemon pods, cert-manager): together every optional grant.
	var sets []map[string]any
	for _, vs := range valueSets {
		if vs.name == "default" || vs.name == "full" {
			sets = append(sets, renderTyped(t, vs))
		}
	}
	for component, uses := range apiUses {
		t.Run(component, func(t *testing.T) {
			var rules []rbacv1.PolicyRule
			for _, objs := range sets {
				for _, key := range roleNames[component] {
					switch obj := objs[key].(type) {
					case *rbacv1.ClusterRole:
						rules = append(rules, obj.Rules...)
					case *rbacv1.Role:
						rules = append(rules, obj.Rules...)
					}
				}
			}
			granted := grants(rules)
			for g := range granted {
				if _, ok := uses[g]; !ok {
					t.Errorf("the chart grants the %s %s, which no code of it uses: remove the grant, or add the call with the code that makes it to apiUses", component, g)
				}
			}
			for u, who := range uses {
				if !granted[u] {
					t.Errorf("the %s needs %s (%s), which the chart does not grant", component, u, who)
				}
			}
			for _, call := range typedCalls(t, "./cmd/"+component) {
				if _, ok := uses[call.use]; !ok {
					t.Errorf("%s calls %s (%s), which apiUses and the chart lack", call.at, call.use, component)
				}
			}
		})
	}
}

// typedCall is a typed clientset call found in the code.
type typedCall struct {
	use apiUse
	at  string
}

var (
	// .CoreV1().Pods(ns).Create( or, held in a variable, pods := ....Pods(ns) then pods.Create(.
	clientsetCall = regexp.MustCompile(`\.(CoreV1|ResourceV1|CoordinationV1|AdmissionregistrationV1|EventsV1|PolicyV1)\(\)\.([A-Z]\w*)\([^()]*\)(\.([A-Z]\w*)\()?`)
	assigned      = regexp.MustCompile(`(\w+)\s*:?=\s*[\w.]*\.(CoreV1|ResourceV1|CoordinationV1|AdmissionregistrationV1|EventsV1|PolicyV1)\(\)\.([A-Z]\w*)\([^()]*\)\s*$`)
	groups        = map[string]string{"CoreV1": "", "ResourceV1": "resource.k8s.io", "CoordinationV1": "coordination.k8s.io", "AdmissionregistrationV1": "admissionregistration.k8s.io", "EventsV1": "events.k8s.io", "PolicyV1": "policy"}
	verbs         = map[string][2]string{"Get": {"", "get"}, "List": {"", "list"}, "Watch": {"", "watch"}, "Create": {"", "create"}, "Update": {"", "update"}, "Patch": {"", "patch"}, "Apply": {"", "patch"}, "Delete": {"", "delete"}, "DeleteCollection": {"", "deletecollection"}, "UpdateStatus": {"/status", "update"}, "ApplyStatus": {"/status", "patch"}, "EvictV1": {"/eviction", "create"}}
)

// typedCalls lists the typed clientset calls (k8s.io/client-go/kubernetes)
// in the repository's packages that binary imports, test files aside.
// Calls through controller-runtime's client name no resource in the
// source and are not found here: the table's comments point at them.
func typedCalls(t *testing.T, binary string) []typedCall {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{end}}", binary)
	cmd.Dir = testutil.Root(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v", binary, err)
	}
	root := testutil.Root(t)
	var calls []typedCall
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.HasPrefix(f[0], root) || strings.Contains(f[0], string(filepath.Separator)+"vendor"+string(filepath.Separator)) {
			continue
		}
		for _, name := range f[1:] {
			p := filepath.Join(f[0], name)
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(root, p)
			calls = append(calls, callsIn(rel, string(data))...)
		}
	}
	return calls
}

// callsIn finds the typed clientset calls in one file's source.
func callsIn(file, src string) []typedCall {
	var calls []typedCall
	add := func(line int, group, accessor, method string) {
		v, ok := verbs[method]
		if !ok {
			return
		}
		res := strings.ToLower(accessor[:1]) + accessor[1:]
		res = strings.ToLower(res)
		if method == "EvictV1" {
			res = "pods"
		}
		calls = append(calls, typedCall{apiUse{groups[group], res + v[0], v[1]}, fmt.Sprintf("%s:%d", file, line)})
	}
	held := map[string][2]string{} // variable -> group, accessor
	for i, line := range strings.Split(src, "\n") {
		if m := assigned.FindStringSubmatch(line); m != nil {
			held[m[1]] = [2]string{m[2], m[3]}
			continue
		}
		for _, m := range clientsetCall.FindAllStringSubmatch(line, -1) {
			if m[4] != "" {
				add(i+1, m[1], m[2], m[4])
			}
		}
		for v, ga := range held {
			for _, m := range regexp.MustCompile(`\b`+regexp.QuoteMeta(v)+`\.([A-Z]\w*)\(`).FindAllStringSubmatch(line, -1) {
				add(i+1, ga[0], ga[1], m[1])
			}
		}
	}
	return calls
}

// The scanner finds what it must: direct and variable-held calls, status
// and eviction subresources.
func TestCallsIn(t *testing.T) {
	src := `
	pods := d.Client.CoreV1().Pods(d.Namespace)
	if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
	}
	_, err = c.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, claim, opts)
	node, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	err = c.CoreV1().Pods(ns).EvictV1(ctx, ev)
`
	var got []string
	for _, c := range callsIn("x.go", src) {
		got = append(got, c.use.String())
	}
	want := []string{"create /pods", "update resource.k8s.io/resourceclaims/status", "get /nodes", "create /pods/eviction"}
	if !slices.Equal(got, want) {
		t.Errorf("calls %v, want %v", got, want)
	}
}
