package helm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/test/testutil"
)

// helpFlags builds a command and returns the flags its --help lists.
func helpFlags(t *testing.T, pkg string) map[string]bool {
	t.Helper()
	root := testutil.Root(t)
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	build := exec.Command(goBinary(), "build", "-o", bin, pkg)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	var out bytes.Buffer
	help := exec.Command(bin, "--help")
	help.Stdout, help.Stderr = &out, &out
	_ = help.Run() // --help may exit 0 or 2
	flags := map[string]bool{}
	for _, m := range flagRE.FindAllStringSubmatch(out.String(), -1) {
		flags[m[1]] = true
	}
	if len(flags) == 0 {
		t.Fatalf("%s --help lists no flags:\n%s", pkg, out.String())
	}
	return flags
}

func argFlags(args []string) []string {
	var out []string
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name := strings.TrimLeft(strings.SplitN(a, "=", 2)[0], "-")
		out = append(out, name)
	}
	return out
}

// TestFlagsExist checks that every flag the chart passes is one the binary
// defines: the flags are a contract between the chart and the commands.
func TestFlagsExist(t *testing.T) {
	used := map[string]map[string][]string{"kubelet-plugin": {}, "controller": {}} // command -> flag -> value sets
	for _, vs := range valueSets {
		objs := renderTyped(t, vs)
		ds := get[*appsv1.DaemonSet](t, objs, "DaemonSet", pluginName)
		d := get[*appsv1.Deployment](t, objs, "Deployment", controllerName)
		p := container(t, ds.Spec.Template.Spec, "kubelet-plugin")
		args := append(append([]string{}, p.Args...), probeArgs(p)...)
		for _, f := range argFlags(args) {
			used["kubelet-plugin"][f] = append(used["kubelet-plugin"][f], vs.name)
		}
		for _, f := range argFlags(container(t, d.Spec.Template.Spec, "controller").Args) {
			used["controller"][f] = append(used["controller"][f], vs.name)
		}
	}
	for _, cmd := range []string{"kubelet-plugin", "controller"} {
		t.Run(cmd, func(t *testing.T) {
			root := testutil.Root(t)
			srcs, _ := filepath.Glob(filepath.Join(root, "cmd", cmd, "*.go"))
			if len(srcs) == 0 {
				t.Skipf("cmd/%s has no sources yet; the chart passes %v", cmd, keys(used[cmd]))
			}
			have := helpFlags(t, "./cmd/"+cmd)
			for _, f := range keys(used[cmd]) {
				if have[f] || f == "v" && have["v"] {
					continue
				}
				t.Errorf("the chart passes --%s to %s (value sets %v) but cmd/%s does not define it: add the flag or change deployments/helm/tessera/templates", f, cmd, used[cmd][f], cmd)
			}
		})
	}
}

// probeArgs are the plugin flags the exec probes pass.
func probeArgs(c corev1.Container) []string {
	var out []string
	for _, probe := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
		if probe != nil && probe.Exec != nil && len(probe.Exec.Command) > 1 {
			out = append(out, probe.Exec.Command[1:]...)
		}
	}
	return out
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestVersionsAgree checks the helm version and the local-cluster image name
// are the same everywhere they are written down.
func TestVersionsAgree(t *testing.T) {
	root := testutil.Root(t)
	mk, err := os.ReadFile(filepath.Join(root, "deployments/helm/helm.mk"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^HELM_VERSION\s*:=\s*` + regexp.QuoteMeta(Version) + `\s*$`).Match(mk) {
		t.Errorf("deployments/helm/helm.mk HELM_VERSION is not %s", Version)
	}
	vals, err := os.ReadFile(filepath.Join(root, LocalClusterValues))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Image struct{ Repository, Tag string } `json:"image"`
	}
	if err := yaml.Unmarshal(vals, &v); err != nil {
		t.Fatal(err)
	}
	if got := v.Image.Repository + ":" + v.Image.Tag; got != LocalClusterImage {
		t.Errorf("%s deploys %s, hack/image builds %s", LocalClusterValues, got, LocalClusterImage)
	}
}

// TestManifestsDecode is a guard for parse(): the multi-document split must
// see every object helm rendered.
func TestManifestsDecode(t *testing.T) {
	out := render(t, valueSets[0])
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	n := 0
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if obj != nil {
			n++
		}
	}
	if got := len(parse(t, out)); got != n {
		t.Errorf("parse found %d objects, the YAML decoder %d", got, n)
	}
}

// TestMetrics: every component has a metrics Service (the plugin's
// headless, one endpoint per node), ServiceMonitors only when asked for,
// the plugin reads the host's /proc read-only for usage, and with
// hostNetwork the plugin declares no metrics port (it would become a host
// port that a seamless upgrade's surge pod could not share).
func TestMetrics(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			objs := renderTyped(t, vs)
			plugin := get[*corev1.Service](t, objs, "Service", ReleaseName+"-kubelet-plugin-metrics")
			if plugin.Spec.ClusterIP != corev1.ClusterIPNone {
				t.Errorf("the plugin's metrics Service has clusterIP %q, want None", plugin.Spec.ClusterIP)
			}
			dep := get[*appsv1.Deployment](t, objs, "Deployment", ReleaseName+"-controller")
			ctrlMetrics := !slices.Contains(container(t, dep.Spec.Template.Spec, "controller").Args, "--metrics-bind-address=0")
			if _, ok := objs["Service/"+ReleaseName+"-controller-metrics"]; ok != ctrlMetrics {
				t.Errorf("controller metrics Service rendered: %v; the controller serves metrics: %v", ok, ctrlMetrics)
			}
			_, monitored := objs["ServiceMonitor/"+ReleaseName+"-kubelet-plugin"]
			if want := vs.name == "full"; monitored != want {
				t.Errorf("ServiceMonitor rendered: %v, want %v", monitored, want)
			}
			ds := get[*appsv1.DaemonSet](t, objs, "DaemonSet", ReleaseName+"-kubelet-plugin")
			c := container(t, ds.Spec.Template.Spec, "kubelet-plugin")
			args := strings.Join(c.Args, " ")
			port := fmt.Sprint(plugin.Spec.Ports[0].Port)
			if !strings.Contains(args, "--metrics-bind-address=") || !strings.Contains(args, ":"+port) || !strings.Contains(args, "--host-proc-root=/host/proc") {
				t.Errorf("plugin args lack the metrics address on port %s or the host /proc: %s", port, args)
			}
			mounted := false
			for _, m := range c.VolumeMounts {
				if m.MountPath == "/host/proc" {
					mounted = m.ReadOnly
				}
			}
			if !mounted {
				t.Error("the host's /proc is not mounted read-only at /host/proc")
			}
			for _, p := range c.Ports {
				if p.Name == "metrics" && ds.Spec.Template.Spec.HostNetwork {
					t.Error("a hostNetwork plugin declares its metrics port (a host port)")
				}
			}
		})
	}
}
