package helm

import (
	"maps"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

var canaryValues = valueSet{name: "canary", files: []string{"test/helm/testdata/canary.values.yaml"}}

const canaryLabel = "tessera.dev/plugin-canary"

// TestCanaryGolden compares the plugin's DaemonSets with canary nodes
// enabled with testdata/canary.golden.yaml (`go test ./test/helm -update`
// rewrites it).
func TestCanaryGolden(t *testing.T) {
	args := append([]string{"template", ReleaseName, ChartPath, "--namespace", DefaultNamespace, "--kube-version", kubeVersion,
		"--show-only", "templates/kubelet-plugin-daemonset.yaml"}, canaryValues.args()...)
	out, err := runHelm(t, args...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	checkGolden(t, "canary", out)
}

// TestCanaryNodes: with canary.enabled the chart renders a second plugin
// DaemonSet whose pods neither DaemonSet's selector shares, with the
// canary's image, flags and environment after the main ones; every node
// is matched by exactly one of the two (with the node label, without it,
// with it set to something other than "true", on GPU and non-GPU nodes,
// with the default GPU affinity and with the user's own); without canary
// nothing changes.
func TestCanaryNodes(t *testing.T) {
	// The plugin's canary DaemonSet and its pods' component label.
	const canaryPlugin = "kubelet-plugin-canary"
	if out := render(t, valueSets[0]); strings.Contains(out, canaryPlugin) {
		t.Error("the default render has a canary plugin")
	}
	// `helm upgrade --reuse-values` from a release older than the canary
	// values renders with no canary block at all.
	if out := render(t, valueSet{name: "no-canary-block", set: []string{"--set", "kubeletPlugin.canary=null"}}); strings.Contains(out, canaryPlugin) {
		t.Error("a render without the canary block has a canary plugin")
	}
	gpu := map[string]string{"nvidia.com/gpu.present": "true"}
	nfd := map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true"}
	with := func(m map[string]string, k, v string) map[string]string {
		out := map[string]string{k: v}
		for a, b := range m {
			out[a] = b
		}
		return out
	}
	userAffinity := []string{"--set-json", `kubeletPlugin.affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"pool","operator":"In","values":["gpu"]}]}]},"preferredDuringSchedulingIgnoredDuringExecution":[{"weight":1,"preference":{"matchExpressions":[{"key":"zone","operator":"In","values":["a"]}]}}]}}`}
	for _, tc := range []struct {
		name string
		vs   valueSet
		// nodes: labels -> the DaemonSet that must run there ("" none).
		nodes []struct {
			labels map[string]string
			want   string
		}
	}{
		{"GPU node affinity", canaryValues, []struct {
			labels map[string]string
			want   string
		}{
			{gpu, "main"},
			{nfd, "main"},
			{with(gpu, canaryLabel, "true"), "canary"},
			{with(nfd, canaryLabel, "true"), "canary"},
			{with(gpu, canaryLabel, "false"), "main"},
			{map[string]string{}, ""},
			{map[string]string{canaryLabel: "true"}, ""},
		}},
		{"the user's affinity", valueSet{name: "canary-affinity", files: canaryValues.files, set: userAffinity}, []struct {
			labels map[string]string
			want   string
		}{
			{map[string]string{"pool": "gpu"}, "main"},
			{map[string]string{"pool": "gpu", canaryLabel: "true"}, "canary"},
			{map[string]string{"pool": "cpu", canaryLabel: "true"}, ""},
		}},
		{"mock mode (no affinity of its own)", valueSet{name: "canary-mock", files: []string{MockValuesPath, canaryValues.files[0]}}, []struct {
			labels map[string]string
			want   string
		}{
			{map[string]string{}, "main"},
			{map[string]string{canaryLabel: "true"}, "canary"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := renderTyped(t, tc.vs)
			ds := map[string]*appsv1.DaemonSet{
				"main":   get[*appsv1.DaemonSet](t, objs, "DaemonSet", pluginName),
				"canary": get[*appsv1.DaemonSet](t, objs, "DaemonSet", pluginName+"-canary"),
			}
			for _, n := range tc.nodes {
				node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: n.labels}}
				var got []string
				for _, name := range []string{"main", "canary"} {
					pod := &corev1.Pod{Spec: ds[name].Spec.Template.Spec}
					ok, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node)
					if err != nil {
						t.Fatal(err)
					}
					if ok {
						got = append(got, name)
					}
				}
				want := []string{n.want}
				if n.want == "" {
					want = nil
				}
				if !slices.Equal(got, want) {
					t.Errorf("node %v runs %v, want %v", n.labels, got, want)
				}
			}
			if tc.vs.name == "canary-affinity" {
				pref := ds["main"].Spec.Template.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
				if len(pref) != 1 || pref[0].Preference.MatchExpressions[0].Key != "zone" {
					t.Errorf("the user's preferred affinity was not kept: %+v", pref)
				}
			}
		})
	}

	objs := renderTyped(t, canaryValues)
	main := get[*appsv1.DaemonSet](t, objs, "DaemonSet", pluginName)
	canary := get[*appsv1.DaemonSet](t, objs, "DaemonSet", pluginName+"-canary")
	for _, pair := range [][2]*appsv1.DaemonSet{{main, canary}, {canary, main}} {
		sel, err := metav1.LabelSelectorAsSelector(pair[0].Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		if !sel.Matches(labels.Set(pair[0].Spec.Template.Labels)) {
			t.Errorf("%s's selector does not match its own pods", pair[0].Name)
		}
		if sel.Matches(labels.Set(pair[1].Spec.Template.Labels)) {
			t.Errorf("%s's selector matches the pods of %s", pair[0].Name, pair[1].Name)
		}
	}
	if main.Spec.Selector.MatchLabels["app.kubernetes.io/component"] != "kubelet-plugin" {
		t.Errorf("the main DaemonSet's selector changed (it is immutable: upgrades would fail): %v", main.Spec.Selector.MatchLabels)
	}
	mc := container(t, main.Spec.Template.Spec, "kubelet-plugin")
	cc := container(t, canary.Spec.Template.Spec, "kubelet-plugin")
	if !strings.HasSuffix(cc.Image, ":v0.9.0-rc1") || cc.Image == mc.Image {
		t.Errorf("canary image %s (main %s), want its own tag", cc.Image, mc.Image)
	}
	if !slices.Equal(cc.Args[:len(mc.Args)], mc.Args) || !slices.Equal(cc.Args[len(mc.Args):], []string{"-v=6"}) {
		t.Errorf("canary args %v, want the main ones %v then -v=6", cc.Args, mc.Args)
	}
	if !hasArg(cc, "--pod-uid=$(POD_UID)") {
		t.Error("the canary does not run in rolling-update mode (--pod-uid): it could not overlap with the main pod on a node")
	}
	env := map[string]string{}
	for _, e := range cc.Env {
		env[e.Name] = e.Value
	}
	if env["TESSERA_PLUGIN_VARIANT"] != "canary" || env["CANARY_NOTE"] != "trial" {
		t.Errorf("canary env %v lacks TESSERA_PLUGIN_VARIANT=canary and its extraEnv", cc.Env)
	}
	for _, e := range mc.Env {
		if e.Name == "TESSERA_PLUGIN_VARIANT" || e.Name == "CANARY_NOTE" {
			t.Errorf("the main plugin has the canary's variable %s", e.Name)
		}
	}
	// Same node directories and service account: the two hand claims over.
	if main.Spec.Template.Spec.ServiceAccountName != canary.Spec.Template.Spec.ServiceAccountName {
		t.Error("the canary runs under another service account (the ResourceSlice policy names one)")
	}
	vols := func(ds *appsv1.DaemonSet) map[string]string {
		out := map[string]string{}
		for _, v := range ds.Spec.Template.Spec.Volumes {
			if v.HostPath != nil {
				out[v.Name] = v.HostPath.Path
			}
		}
		return out
	}
	if mv, cv := vols(main), vols(canary); len(mv) == 0 || !maps.Equal(mv, cv) {
		t.Errorf("host paths differ: main %v, canary %v", mv, cv)
	}
}
