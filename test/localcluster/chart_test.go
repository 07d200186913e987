package localcluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/test/helm"
)

func TestInstallModeDefault(t *testing.T) {
	t.Setenv("TESSERA_INSTALL", "")
	if m := DefaultInstallMode(); m != InstallChart {
		t.Errorf("default install mode %q, want %q", m, InstallChart)
	}
	t.Setenv("TESSERA_INSTALL", "host")
	if c := testCluster(t); c.Opts.Install != InstallHost || c.ChartMode() {
		t.Errorf("TESSERA_INSTALL=host: install mode %q", c.Opts.Install)
	}
	if _, err := New(Options{WorkDir: t.TempDir(), Install: "docker"}); err == nil {
		t.Error("an unknown install mode was accepted")
	}
}

// Plugin flags become chart values; the rest goes to extraArgs; flags the
// chart sets itself are dropped; later flags win.
func TestPluginValues(t *testing.T) {
	got, err := PluginValues(
		PluginConfig{Profile: "h100-80gb", Args: []string{"--mock-mig=all", "--time-slices=4", "-v=5", "--mig-mode=static", "--health-ignored-xids=13", "--rescan-interval=30s"}},
		"--kubeconfig=/x", "--time-slices=2", "--reserved-memory=512Mi", "--cdi-root=/y")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"mock":           map[string]any{"profile": "h100-80gb", "mig": "all"},
		"timeSlices":     4,
		"logVerbosity":   5,
		"migMode":        "static",
		"reservedMemory": "512Mi",
		"rescanInterval": "30s",
		"extraArgs":      []string{"--health-ignored-xids=13"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("PluginValues =\n%v\nwant\n%v", got, want)
	}
	if _, err := PluginValues(PluginConfig{Profile: "t4", Args: []string{"--time-slices=four"}}); err == nil {
		t.Error("--time-slices=four accepted")
	}
}

// The values the harness generates render, with the localcluster values,
// into a DaemonSet whose plugin runs with the configuration's flags; the
// controller and its webhooks come and go together.
func TestChartValuesRender(t *testing.T) {
	bin := os.Getenv("HELM")
	if bin == "" {
		bin = helm.BinaryPath()
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no helm at %s (make helm-bin)", bin)
	}
	c := testCluster(t)
	if c.Opts.RepoRoot == "" {
		t.Skip("not in the repository")
	}
	render := func(st chartState) (ds *appsv1.DaemonSet, kinds []string) {
		t.Helper()
		vals, err := c.chartValues(st)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := yaml.Marshal(vals)
		file := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(file, b, 0o644); err != nil {
			t.Fatal(err)
		}
		args := helm.LocalClusterInstallArgs(c.Opts.RepoRoot, "/nonexistent", c.Dirs.MockDevices, "", "--values", file)
		// upgrade --install <release> <chart> [flags] -> template <release> <chart> [flags]
		args = append([]string{"template"}, args[2:]...)
		args = slices.DeleteFunc(args, func(a string) bool { return a == "--wait" || a == "--create-namespace" })
		for i := 0; i < len(args); i++ {
			if args[i] == "--kubeconfig" || args[i] == "--timeout" {
				args = slices.Delete(args, i, i+2)
				i--
			}
		}
		cmd := exec.Command(bin, args...)
		tmp := t.TempDir()
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+tmp, "HELM_CONFIG_HOME="+tmp, "HELM_DATA_HOME="+tmp)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		for _, doc := range strings.Split(string(out), "\n---") {
			var obj struct {
				Kind string `json:"kind"`
			}
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil || obj.Kind == "" {
				continue
			}
			kinds = append(kinds, obj.Kind)
			if obj.Kind == "DaemonSet" {
				ds = &appsv1.DaemonSet{}
				if err := yaml.Unmarshal([]byte(doc), ds); err != nil {
					t.Fatal(err)
				}
			}
		}
		return ds, kinds
	}

	ds, kinds := render(chartState{plugin: true, starts: 3, pluginCfg: PluginConfig{Profile: "t4:1", Args: []string{"--time-slices=4", "-v=5"}}})
	if ds == nil {
		t.Fatalf("no DaemonSet rendered (kinds %v)", kinds)
	}
	args, err := daemonSetPluginArgs(ds)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--mock-profile=t4:1", "--time-slices=4", "-v=5", "--mock-device-root=" + c.Dirs.MockDevices} {
		if !slices.Contains(args, want) {
			t.Errorf("plugin args %v lack %s", args, want)
		}
	}
	if got := ds.Spec.Template.Annotations[StartAnnotation]; got != "3" {
		t.Errorf("pod template annotation %s=%q, want 3", StartAnnotation, got)
	}
	if ds.Name != ChartPluginDaemonSet || ds.Namespace != ChartNamespace {
		t.Errorf("DaemonSet %s/%s, want %s/%s", ds.Namespace, ds.Name, ChartNamespace, ChartPluginDaemonSet)
	}
	if slices.Contains(kinds, "Deployment") || slices.Contains(kinds, "MutatingWebhookConfiguration") {
		t.Errorf("controller off, but rendered %v", kinds)
	}
	if !slices.Contains(kinds, "DeviceClass") {
		t.Errorf("no DeviceClass rendered: %v", kinds)
	}

	_, kinds = render(chartState{plugin: true, controller: true, pluginCfg: PluginConfig{Profile: "t4:2"}})
	for _, k := range []string{"Deployment", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "DaemonSet"} {
		if !slices.Contains(kinds, k) {
			t.Errorf("controller on: no %s rendered (%v)", k, kinds)
		}
	}
	ds, kinds = render(chartState{controller: true})
	if ds != nil || !slices.Contains(kinds, "Deployment") {
		t.Errorf("plugin off, controller on: rendered %v", kinds)
	}
}

func TestDriverPodLogName(t *testing.T) {
	c := testCluster(t)
	p := filepath.Join(c.podLogsDir(), "tessera-system_tessera-kubelet-plugin-x7k2p_5a2f4d28-dc54-493e-bb1a-4653e63bef49", "kubelet-plugin", "1.log")
	if got, want := c.driverPodLogName(p), "pod_tessera-system_tessera-kubelet-plugin-x7k2p_kubelet-plugin_1.log"; got != want {
		t.Errorf("driverPodLogName = %q, want %q", got, want)
	}
}

// The plugin binary is found in an OCI archive's layers.
func TestExtractFromImage(t *testing.T) {
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("Debian's busybox-static is not installed")
	}
	dir := t.TempDir()
	archive := filepath.Join(dir, "busybox.tar")
	if err := writeBusyboxImage("/bin/busybox", archive); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "busybox")
	if err := extractFromImage(archive, "bin/busybox", dst); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile("/bin/busybox")
	b, _ := os.ReadFile(dst)
	if !slices.Equal(a, b) {
		t.Error("extracted file differs")
	}
	if err := extractFromImage(archive, "usr/bin/kubelet-plugin", dst); err == nil {
		t.Error("a missing file was found")
	}
}

// A host-mode controller runs with the gates the chart-mode one gets from
// the local cluster's values: the same tests pass in both modes.
func TestControllerFeatureGatesMatchChart(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", helm.LocalClusterValues))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Controller struct {
			FeatureGates map[string]bool `json:"featureGates"`
		} `json:"controller"`
	}
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	var chart []string
	for k, on := range v.Controller.FeatureGates {
		chart = append(chart, k+"="+strconv.FormatBool(on))
	}
	slices.Sort(chart)
	if got := strings.Join(chart, ","); got != ControllerFeatureGates {
		t.Errorf("%s controller.featureGates = %s; host mode's ControllerFeatureGates = %s", helm.LocalClusterValues, got, ControllerFeatureGates)
	}
}
