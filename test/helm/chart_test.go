package helm

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	tesserav1alpha1 "github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/deployments"
	"github.com/tessera-dev/tessera/test/testutil"
)

var update = flag.Bool("update", false, "rewrite the golden renders in testdata/ instead of comparing")

// kubeVersion is what `helm template` assumes the cluster runs.
const kubeVersion = "1.37.0"

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helmBinary returns the pinned helm, building it on first use. The test is
// skipped only when helm cannot be built.
func helmBinary(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		helmPath, helmErr = Binary(ctx, func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) })
	})
	if helmErr != nil {
		t.Skipf("SKIP: helm %s could not be built from the Go module proxy, so the chart is not checked: %v", Version, helmErr)
	}
	return helmPath
}

func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Dir = testutil.Root(t)
	// No kubeconfig, no repositories, no cache outside a temp dir: the
	// render must not depend on the machine.
	tmp := t.TempDir()
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+filepath.Join(tmp, "no-kubeconfig"),
		"HELM_CACHE_HOME="+filepath.Join(tmp, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(tmp, "config"),
		"HELM_DATA_HOME="+filepath.Join(tmp, "data"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// valueSet is one configuration the chart is rendered with.
type valueSet struct {
	name  string
	files []string // relative to the repository root
	set   []string // --set-string / --set arguments, already paired
}

func (v valueSet) args() []string {
	var a []string
	for _, f := range v.files {
		a = append(a, "--values", f)
	}
	return append(a, v.set...)
}

var valueSets = []valueSet{
	{name: "default"},
	{name: "mock", files: []string{MockValuesPath}},
	{name: "localcluster", files: []string{LocalClusterValues},
		set: []string{"--set-string", "kubeletPlugin.mock.deviceRoot=/var/lib/tessera-localcluster/mock-devices",
			"--set-string", "kubeletPlugin.mock.driverRoot=/var/lib/tessera-localcluster/driver-root"}},
	{name: "full", files: []string{"test/helm/testdata/full.values.yaml"}},
	// The interposer copied onto the nodes from an image the user names.
	{name: "interposer", set: []string{"--set", "kubeletPlugin.interposer.install.enabled=true",
		"--set-string", "kubeletPlugin.interposer.install.image=registry.example/hami-core:v2.5"}},
}

// render runs helm template for a value set.
func render(t *testing.T, vs valueSet) string {
	t.Helper()
	args := append([]string{"template", ReleaseName, ChartPath, "--namespace", DefaultNamespace, "--kube-version", kubeVersion}, vs.args()...)
	out, err := runHelm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// manifest is one rendered object.
type manifest struct {
	source string // "# Source:" line
	raw    []byte
	meta   struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ObjectMeta `json:"metadata"`
	}
}

func (m *manifest) key() string { return m.meta.Kind + "/" + m.meta.Metadata.Name }

func parse(t *testing.T, out string) []*manifest {
	t.Helper()
	var ms []*manifest
	for _, doc := range strings.Split(out, "\n---\n") {
		doc = strings.TrimPrefix(strings.TrimSpace(doc), "---")
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		m := &manifest{raw: []byte(doc)}
		if i := strings.Index(doc, "# Source: "); i >= 0 {
			m.source = strings.SplitN(doc[i+len("# Source: "):], "\n", 2)[0]
		}
		if err := yaml.Unmarshal(m.raw, &m.meta); err != nil {
			t.Fatalf("%s: not YAML: %v\n%s", m.source, err, doc)
		}
		ms = append(ms, m)
	}
	return ms
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// typed decodes every object strictly into its Go type: a misplaced or
// misspelt field in a template fails here, before any cluster sees it.
func typed(t *testing.T, ms []*manifest) map[string]any {
	t.Helper()
	objs := map[string]any{}
	for _, m := range ms {
		var obj any
		switch m.meta.APIVersion + "/" + m.meta.Kind {
		case "apps/v1/DaemonSet":
			obj = &appsv1.DaemonSet{}
		case "apps/v1/Deployment":
			obj = &appsv1.Deployment{}
		case "v1/ServiceAccount":
			obj = &corev1.ServiceAccount{}
		case "v1/Service":
			obj = &corev1.Service{}
		case "v1/Secret":
			obj = &corev1.Secret{}
		case "v1/ConfigMap":
			obj = &corev1.ConfigMap{}
		case "rbac.authorization.k8s.io/v1/ClusterRole":
			obj = &rbacv1.ClusterRole{}
		case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
			obj = &rbacv1.ClusterRoleBinding{}
		case "rbac.authorization.k8s.io/v1/Role":
			obj = &rbacv1.Role{}
		case "rbac.authorization.k8s.io/v1/RoleBinding":
			obj = &rbacv1.RoleBinding{}
		case "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy":
			obj = &admissionregistrationv1.ValidatingAdmissionPolicy{}
		case "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding":
			obj = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		case "admissionregistration.k8s.io/v1/MutatingWebhookConfiguration":
			obj = &admissionregistrationv1.MutatingWebhookConfiguration{}
		case "admissionregistration.k8s.io/v1/ValidatingWebhookConfiguration":
			obj = &admissionregistrationv1.ValidatingWebhookConfiguration{}
		case "policy/v1/PodDisruptionBudget":
			obj = &policyv1.PodDisruptionBudget{}
		case "resource.k8s.io/v1/DeviceClass":
			obj = &resourceapi.DeviceClass{}
		case "tessera.dev/v1alpha1/Queue":
			obj = &tesserav1alpha1.Queue{}
		case "v1/Pod":
			obj = &corev1.Pod{}
		case "cert-manager.io/v1/Issuer", "cert-manager.io/v1/Certificate", "monitoring.coreos.com/v1/ServiceMonitor":
			obj = map[string]any{} // no Go types here; checked by shape below
		default:
			t.Errorf("%s: unexpected object %s %s; add it to typed()", m.source, m.meta.APIVersion, m.meta.Kind)
			continue
		}
		if err := yaml.UnmarshalStrict(m.raw, &obj); err != nil {
			t.Errorf("%s: %s does not decode strictly: %v", m.source, m.key(), err)
			continue
		}
		if _, dup := objs[m.key()]; dup {
			t.Errorf("%s: %s rendered twice", m.source, m.key())
		}
		objs[m.key()] = obj
	}
	return objs
}

func get[T any](t *testing.T, objs map[string]any, kind, name string) T {
	t.Helper()
	o, ok := objs[kind+"/"+name]
	if !ok {
		var keys []string
		for k := range objs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		t.Fatalf("%s/%s not rendered; have %v", kind, name, keys)
	}
	return o.(T)
}

func byKind[T any](objs map[string]any) []T {
	var out []T
	keys := make([]string, 0, len(objs))
	for k := range objs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if o, ok := objs[k].(T); ok {
			out = append(out, o)
		}
	}
	return out
}

const (
	pluginName     = "tessera-kubelet-plugin"
	controllerName = "tessera-controller"
)

// TestLint runs helm lint --strict with the defaults and every values file.
func TestLint(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			args := append([]string{"lint", "--strict", ChartPath, "--kube-version", kubeVersion}, vs.args()...)
			if out, err := runHelm(t, args...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}

// TestGolden compares each render with testdata/<name>.golden.yaml.
func TestGolden(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			checkGolden(t, vs.name, render(t, vs))
		})
	}
}

// checkGolden compares a render with testdata/<name>.golden.yaml, or
// rewrites that file under -update.
func checkGolden(t *testing.T, name, out string) {
	t.Helper()
	golden := filepath.Join(testutil.Root(t), "test/helm/testdata", name+".golden.yaml")
	if *update {
		if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run `make helm-update` or `go test ./test/helm -update` to create it)", err)
	}
	if string(want) != out {
		t.Errorf("render %q differs from %s (if the change is intended: `make helm-update`):\n%s", name, golden, diff(string(want), out))
	}
}

// diff is a small line diff: enough to see what moved.
func diff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out []string
	i, j := 0, 0
	for i < len(al) || j < len(bl) {
		switch {
		case i < len(al) && j < len(bl) && al[i] == bl[j]:
			i++
			j++
		default:
			// Find the next resynchronisation point.
			found := false
			for d := 1; d < 50 && !found; d++ {
				if i+d <= len(al) && j < len(bl) && i+d < len(al) && al[i+d] == bl[j] {
					for ; d > 0; d-- {
						out = append(out, fmt.Sprintf("%5d - %s", i+1, al[i]))
						i++
					}
					found = true
				} else if j+d < len(bl) && i < len(al) && bl[j+d] == al[i] {
					for ; d > 0; d-- {
						out = append(out, fmt.Sprintf("%5d + %s", j+1, bl[j]))
						j++
					}
					found = true
				}
			}
			if !found {
				if i < len(al) {
					out = append(out, fmt.Sprintf("%5d - %s", i+1, al[i]))
					i++
				}
				if j < len(bl) {
					out = append(out, fmt.Sprintf("%5d + %s", j+1, bl[j]))
					j++
				}
			}
		}
		if len(out) > 80 {
			out = append(out, "...")
			break
		}
	}
	return strings.Join(out, "\n")
}

func renderTyped(t *testing.T, vs valueSet) map[string]any {
	t.Helper()
	return typed(t, parse(t, render(t, vs)))
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

func hasArg(c corev1.Container, arg string) bool {
	for _, a := range c.Args {
		if a == arg {
			return true
		}
	}
	return false
}

func argValue(c corev1.Container, flagName string) (string, bool) {
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, flagName+"="); ok {
			return v, true
		}
	}
	return "", false
}

func envVar(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func hostPaths(spec corev1.PodSpec) map[string]string {
	out := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			out[v.Name] = v.HostPath.Path
		}
	}
	return out
}

func mountPath(c corev1.Container, volume string) string {
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return m.MountPath
		}
	}
	return ""
}

// TestKubeletPlugin checks the DaemonSet's properties the kubelet and the
// plugin rely on.
func TestKubeletPlugin(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			objs := renderTyped(t, vs)
			ds := get[*appsv1.DaemonSet](t, objs, "DaemonSet", pluginName)
			spec := ds.Spec.Template.Spec
			c := container(t, spec, "kubelet-plugin")
			if spec.PriorityClassName != "system-node-critical" {
				t.Errorf("priorityClassName = %q, want system-node-critical", spec.PriorityClassName)
			}
			if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
				t.Errorf("kubelet plugin is not privileged: %+v", c.SecurityContext)
			}
			if c.Command[0] != "/usr/bin/kubelet-plugin" {
				t.Errorf("command = %v", c.Command)
			}
			// The three kubelet paths, mounted at the same path inside.
			hp := hostPaths(spec)
			for vol, path := range map[string]string{
				"plugins-registry": "/var/lib/kubelet/plugins_registry",
				"plugin-data":      "/var/lib/kubelet/plugins/gpu.tessera.dev",
				"cdi":              "/var/run/cdi",
			} {
				if hp[vol] != path {
					t.Errorf("hostPath %s = %q, want %q", vol, hp[vol], path)
				}
				if mountPath(c, vol) != path {
					t.Errorf("volume %s mounted at %q, want %q", vol, mountPath(c, vol), path)
				}
			}
			for flagName, want := range map[string]string{
				"--node-name":       "$(NODE_NAME)",
				"--registrar-dir":   "/var/lib/kubelet/plugins_registry",
				"--plugin-data-dir": "/var/lib/kubelet/plugins/gpu.tessera.dev",
				"--cdi-root":        "/var/run/cdi",
			} {
				if v, _ := argValue(c, flagName); v != want {
					t.Errorf("%s = %q, want %q (args %v)", flagName, v, want, c.Args)
				}
			}
			for name, field := range map[string]string{"NODE_NAME": "spec.nodeName", "POD_UID": "metadata.uid"} {
				e := envVar(c, name)
				if e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != field {
					t.Errorf("env %s is not the downward API's %s: %+v", name, field, e)
				}
			}
			if ds.Spec.Template.Spec.ServiceAccountName != pluginName {
				t.Errorf("serviceAccountName = %q", spec.ServiceAccountName)
			}
			switch vs.name {
			case "default":
				if !hasArg(c, "--gpu-backend=nvml") || !hasArg(c, "--nvml-library=/driver-root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1") ||
					!hasArg(c, "--nvidia-smi=/driver-root/usr/bin/nvidia-smi") {
					t.Errorf("default must use NVML from the driver root: %v", c.Args)
				}
				if hp["driver-root"] != "/" || mountPath(c, "driver-root") != "/driver-root" {
					t.Errorf("driver root not mounted: %v", hp)
				}
				if !hasArg(c, "--driver-root=/") || !hasArg(c, "--container-driver-root=/driver-root") ||
					!hasArg(c, "--dev-root=/") || !hasArg(c, "--container-dev-root=/host-dev-root") {
					t.Errorf("claims must get the driver files of the mounted driver root: %v", c.Args)
				}
				if hp["host-dev"] != "/dev" || mountPath(c, "host-dev") != "/host-dev-root/dev" {
					t.Errorf("the host's /dev must be mounted at /host-dev-root/dev (missing control nodes are created there): %v", hp)
				}
				if spec.HostNetwork {
					t.Error("hostNetwork is on by default")
				}
				for name, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
					want := []string{"/usr/bin/kubelet-plugin", "--probe=" + strings.Replace(name, "startup", "readiness", 1), "--healthcheck-socket=/tmp/health.sock"}
					if probe == nil || probe.Exec == nil || !slices.Equal(probe.Exec.Command, want) {
						t.Errorf("%s probe %+v, want exec %v", name, probe, want)
					}
				}
				if !hasArg(c, "--healthcheck-socket=/tmp/health.sock") || mountPath(c, "tmp") != "/tmp" {
					t.Errorf("exec probes need the health socket in the pod's own /tmp: args %v", c.Args)
				}
				if a := spec.Affinity; a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil ||
					len(a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) != 2 ||
					a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key != "nvidia.com/gpu.present" {
					t.Errorf("by default the plugin must only run on GPU nodes (GPU operator or NFD labels): affinity %+v", a)
				}
			case "mock", "localcluster":
				if spec.Affinity != nil {
					t.Errorf("mock nodes have no GPU labels: no node affinity by default, got %+v", spec.Affinity)
				}
				if !hasArg(c, "--gpu-backend=mock") || !hasArg(c, "--mock-profile=t4:2") {
					t.Errorf("mock args missing: %v", c.Args)
				}
				root, ok := argValue(c, "--mock-device-root")
				if !ok || hp["mock-devices"] != root || mountPath(c, "mock-devices") != root {
					t.Errorf("mock device root %q must be a hostPath mounted at the same path: %v", root, hp)
				}
				// Mock mode mounts only a fixture driver root, at the path
				// --driver-root names.
				if dr, ok := argValue(c, "--driver-root"); ok != (vs.name == "localcluster") || hp["driver-root"] != dr || (ok && mountPath(c, "driver-root") != dr) {
					t.Errorf("mock driver root: --driver-root=%q (set %v), hostPath %q mounted at %q", dr, ok, hp["driver-root"], mountPath(c, "driver-root"))
				}
				if _, ok := argValue(c, "--nvml-library"); ok {
					t.Error("mock mode passes --nvml-library")
				}
			}
			if vs.name == "localcluster" {
				if !spec.HostNetwork || c.ImagePullPolicy != corev1.PullNever || c.Image != LocalClusterImage {
					t.Errorf("local cluster: hostNetwork=%v pullPolicy=%s image=%s", spec.HostNetwork, c.ImagePullPolicy, c.Image)
				}
				if e := envVar(c, "KUBERNETES_SERVICE_HOST"); e == nil || e.Value != "127.0.0.1" {
					t.Errorf("local cluster: KUBERNETES_SERVICE_HOST = %+v", e)
				}
			} else if envVar(c, "KUBERNETES_SERVICE_HOST") != nil {
				t.Error("KUBERNETES_SERVICE_HOST is set outside the local cluster")
			}
			if vs.name == "full" {
				if ds.Spec.UpdateStrategy.RollingUpdate == nil || ds.Spec.UpdateStrategy.RollingUpdate.MaxSurge == nil ||
					ds.Spec.UpdateStrategy.RollingUpdate.MaxSurge.IntValue() != 1 || !hasArg(c, "--pod-uid=$(POD_UID)") {
					t.Errorf("seamlessUpgrade: strategy %+v args %v", ds.Spec.UpdateStrategy, c.Args)
				}
				for name, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
					want := name
					if name == "startup" {
						want = "readiness"
					}
					if probe == nil || probe.GRPC == nil || probe.GRPC.Port != 51515 || probe.GRPC.Service == nil || *probe.GRPC.Service != want {
						t.Errorf("%s probe: %+v, want gRPC on 51515 service %q", name, probe, want)
					}
				}
				if !hasArg(c, "--healthcheck-port=51515") {
					t.Errorf("gRPC probes without --healthcheck-port: %v", c.Args)
				}
				cm := get[*corev1.ConfigMap](t, objs, "ConfigMap", pluginName)
				if !hasArg(c, "--time-slices-config=/etc/tessera/time-slices.yaml") || !hasArg(c, "--mock-config=/etc/tessera/mock-node.yaml") {
					t.Errorf("config files not passed: %v", c.Args)
				}
				ts := map[string]int{}
				if err := yaml.UnmarshalStrict([]byte(cm.Data["time-slices.yaml"]), &ts); err != nil || ts["0"] != 4 {
					t.Errorf("time-slices.yaml = %q (%v)", cm.Data["time-slices.yaml"], err)
				}
				if hp["mps-pipes"] != "/run/nvidia/mps" || mountPath(c, "mps-pipes") != "/run/nvidia/mps" || !hasArg(c, "--mps-pipe-dir=/run/nvidia/mps") {
					t.Errorf("MPS pipe directory not passed and mounted: %v %v", hp, c.Args)
				}
				if hp["interposer"] != "/usr/local/vgpu/libvgpu.so" || !hasArg(c, "--health-ignored-xids=13,31,43") {
					t.Errorf("interposer %q, args %v", hp["interposer"], c.Args)
				}
				if !hasArg(c, "--disabled-cdi-hooks=enable-cuda-compat,update-application-profile") {
					t.Errorf("disabledCDIHooks not passed: %v", c.Args)
				}
				if ds.Spec.Template.Annotations["checksum/config"] == "" {
					t.Error("no config checksum: a config change would not roll the pods")
				}
			}
		})
	}
}

// TestController checks the Deployment and that the names it is told match
// the objects the chart renders.
func TestController(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			objs := renderTyped(t, vs)
			d := get[*appsv1.Deployment](t, objs, "Deployment", controllerName)
			spec := d.Spec.Template.Spec
			c := container(t, spec, "controller")
			if spec.SecurityContext == nil || spec.SecurityContext.RunAsNonRoot == nil || !*spec.SecurityContext.RunAsNonRoot {
				t.Error("controller does not run as non-root")
			}
			if c.SecurityContext == nil || c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
				t.Error("controller is privileged")
			}
			if c.ReadinessProbe == nil || c.LivenessProbe == nil {
				t.Error("controller has no probes")
			}
			if !hasArg(c, "--leader-elect=true") {
				t.Errorf("no leader election: %v", c.Args)
			}
			mwc := byKind[*admissionregistrationv1.MutatingWebhookConfiguration](objs)
			vwc := byKind[*admissionregistrationv1.ValidatingWebhookConfiguration](objs)
			if len(mwc) != 1 || len(vwc) != 1 {
				t.Fatalf("want one mutating and one validating webhook configuration, got %d and %d", len(mwc), len(vwc))
			}
			selfSigned := vs.name != "full" // full uses cert-manager
			if selfSigned {
				for flagName, want := range map[string]string{
					"--mutating-webhook-configuration":   mwc[0].Name,
					"--validating-webhook-configuration": vwc[0].Name,
				} {
					if v, _ := argValue(c, flagName); v != want {
						t.Errorf("%s = %q, want the rendered %q", flagName, v, want)
					}
				}
				secret, _ := argValue(c, "--webhook-cert-secret")
				get[*corev1.Secret](t, objs, "Secret", secret)
				for _, w := range mwc[0].Webhooks {
					if len(w.ClientConfig.CABundle) != 0 {
						t.Error("self-signed mode renders a caBundle; the controller owns it")
					}
				}
			} else {
				if _, ok := argValue(c, "--webhook-cert-secret"); ok {
					t.Error("cert-manager mode still asks the controller to manage certificates")
				}
				if mwc[0].Annotations["cert-manager.io/inject-ca-from"] == "" {
					t.Error("cert-manager mode without CA injection")
				}
			}
			hosts, _ := argValue(c, "--webhook-cert-hosts")
			for _, w := range mwc[0].Webhooks {
				// The translating webhook (translation.enabled) selects by
				// namespace and match condition (TestTranslationValues).
				if w.Name != "translate.pods.admission.tessera.dev" && (w.ObjectSelector == nil || len(w.ObjectSelector.MatchExpressions) != 1 || w.ObjectSelector.MatchExpressions[0].Key != "tessera.dev/queue") {
					t.Errorf("pod webhook must only see pods with the tessera.dev/queue label: %+v", w.ObjectSelector)
				}
				if *w.FailurePolicy != admissionregistrationv1.Fail {
					t.Errorf("pod webhook failurePolicy = %s", *w.FailurePolicy)
				}
				if vs.name == "localcluster" {
					if w.ClientConfig.URL == nil || !strings.HasPrefix(*w.ClientConfig.URL, "https://127.0.0.1:") || w.ClientConfig.Service != nil {
						t.Errorf("local cluster webhook must be called on 127.0.0.1: %+v", w.ClientConfig)
					}
					if hosts != "127.0.0.1" {
						t.Errorf("certificate hosts = %q, want 127.0.0.1", hosts)
					}
				} else {
					svc := w.ClientConfig.Service
					if svc == nil {
						t.Fatalf("webhook without a Service: %+v", w.ClientConfig)
					}
					get[*corev1.Service](t, objs, "Service", svc.Name)
					if selfSigned && !strings.Contains(hosts, svc.Name+"."+svc.Namespace+".svc") {
						t.Errorf("certificate hosts %q do not cover the Service %s/%s", hosts, svc.Namespace, svc.Name)
					}
				}
			}
			if vs.name == "localcluster" {
				if !spec.HostNetwork || *d.Spec.Replicas != 1 {
					t.Errorf("local cluster controller: hostNetwork=%v replicas=%d", spec.HostNetwork, *d.Spec.Replicas)
				}
				for _, a := range c.Args {
					if strings.Contains(a, "-address=:") {
						t.Errorf("local cluster: %s listens on all addresses", a)
					}
				}
			}
			if vs.name == "full" || vs.name == "default" {
				if *d.Spec.Replicas != 2 || spec.Affinity == nil || spec.Affinity.PodAntiAffinity == nil {
					t.Errorf("two replicas should be spread: replicas=%d affinity=%+v", *d.Spec.Replicas, spec.Affinity)
				}
				get[*policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget", controllerName)
			}
			if vs.name == "default" && spec.PriorityClassName != "system-cluster-critical" {
				t.Errorf("controller priorityClassName %q, want system-cluster-critical", spec.PriorityClassName)
			}
		})
	}
}

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

// gpuConfig mirrors api/v1alpha1.GpuConfig's wire form.
// TODO(packaging): decode with v1alpha1.DecodeGpuConfig once it is committed.
type gpuConfig struct {
	APIVersion        string   `json:"apiVersion"`
	Kind              string   `json:"kind"`
	Enforcement       string   `json:"enforcement,omitempty"`
	MinEnforcement    string   `json:"minEnforcement,omitempty"`
	TimeSliceInterval string   `json:"timeSliceInterval,omitempty"`
	FrameworkCaps     []string `json:"frameworkCaps,omitempty"`
	ComputeDefault    string   `json:"computeDefault,omitempty"`
}

// TestDeviceClasses checks that the chart's classes are the shipped
// deployments/deviceclasses.yaml, plus the optional fields.
func TestDeviceClasses(t *testing.T) {
	shipped, err := deployments.DeviceClasses()
	if err != nil {
		t.Fatal(err)
	}
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			objs := renderTyped(t, vs)
			classes := byKind[*resourceapi.DeviceClass](objs)
			if len(classes) != len(shipped) {
				t.Fatalf("chart renders %d DeviceClasses, deployments/deviceclasses.yaml has %d", len(classes), len(shipped))
			}
			for _, want := range shipped {
				got := get[*resourceapi.DeviceClass](t, objs, "DeviceClass", want.Name)
				if !equality.Semantic.DeepEqual(got.Spec.Selectors, want.Spec.Selectors) {
					t.Errorf("%s: selectors differ from deployments/deviceclasses.yaml:\n got %+v\nwant %+v", want.Name, got.Spec.Selectors, want.Spec.Selectors)
				}
				if vs.name != "full" {
					if !equality.Semantic.DeepEqual(got.Spec, want.Spec) {
						t.Errorf("%s: spec differs from deployments/deviceclasses.yaml:\n got %+v\nwant %+v", want.Name, got.Spec, want.Spec)
					}
					continue
				}
				// full: extendedResourceName on gpu.tessera.dev, class config on
				// the classes that enforce something.
				if (want.Name == "gpu.tessera.dev") != (got.Spec.ExtendedResourceName != nil && *got.Spec.ExtendedResourceName == "tessera.dev/gpu") {
					t.Errorf("%s: extendedResourceName = %v", want.Name, got.Spec.ExtendedResourceName)
				}
				if want.Name == "mig.tessera.dev" {
					if len(got.Spec.Config) != 0 {
						t.Errorf("MIG class carries enforcement config")
					}
					continue
				}
				if len(got.Spec.Config) != 1 || got.Spec.Config[0].Opaque == nil || got.Spec.Config[0].Opaque.Driver != "gpu.tessera.dev" {
					t.Fatalf("%s: config = %+v", want.Name, got.Spec.Config)
				}
				var cfg gpuConfig
				if err := yaml.UnmarshalStrict(got.Spec.Config[0].Opaque.Parameters.Raw, &cfg); err != nil {
					t.Fatalf("%s: GpuConfig does not decode: %v", want.Name, err)
				}
				if cfg.APIVersion != "tessera.dev/v1alpha1" || cfg.Kind != "GpuConfig" || cfg.Enforcement != "interposer" || cfg.MinEnforcement != "interposer" ||
					cfg.TimeSliceInterval != "Short" || strings.Join(cfg.FrameworkCaps, ",") != "pytorch" || cfg.ComputeDefault != "uncapped" {
					t.Errorf("%s: GpuConfig = %+v", want.Name, cfg)
				}
			}
		})
	}
}

// TestDefaultQueue checks the Queue decodes into the API type with the
// values' resources.
func TestDefaultQueue(t *testing.T) {
	objs := renderTyped(t, valueSets[0])
	q := get[*tesserav1alpha1.Queue](t, objs, "Queue", "default")
	if q.Spec.Parent != "" || len(q.Spec.Resources) != 0 {
		t.Errorf("default queue = %+v, want a top-level queue without quota", q.Spec)
	}
	objs = renderTyped(t, valueSets[3])
	q = get[*tesserav1alpha1.Queue](t, objs, "Queue", "research")
	mem := q.Spec.Resources[tesserav1alpha1.ResourceGPUMemory]
	if mem.Quota == nil || mem.Quota.String() != "16Gi" || mem.Limit == nil || mem.Limit.String() != "32Gi" || mem.OverQuotaWeight == nil || *mem.OverQuotaWeight != 2 {
		t.Errorf("queue resources = %+v", q.Spec.Resources)
	}
	if q.Spec.Priority != 10 {
		t.Errorf("priority = %d", q.Spec.Priority)
	}
}

// TestCRDsInSync checks the chart carries the generated CRDs unchanged.
func TestCRDsInSync(t *testing.T) {
	root := testutil.Root(t)
	src, _ := filepath.Glob(filepath.Join(root, "deployments/crds/*.yaml"))
	dst, _ := filepath.Glob(filepath.Join(root, ChartPath, "crds/*.yaml"))
	if len(src) == 0 {
		t.Fatal("no CRDs in deployments/crds")
	}
	names := func(paths []string) []string {
		var out []string
		for _, p := range paths {
			out = append(out, filepath.Base(p))
		}
		return out
	}
	if strings.Join(names(src), ",") != strings.Join(names(dst), ",") {
		t.Fatalf("chart CRDs %v != deployments/crds %v: run `make chart-crds`", names(dst), names(src))
	}
	for i := range src {
		a, _ := os.ReadFile(src[i])
		b, _ := os.ReadFile(dst[i])
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s: run `make chart-crds`", dst[i], src[i])
		}
	}
}

// TestSchemaRejects checks values.schema.json and the template checks turn
// mistakes into errors that name the problem.
func TestSchemaRejects(t *testing.T) {
	cases := []struct {
		name string
		set  []string
		want string
	}{
		{"typo in a key", []string{"--set", "kubeletPlugin.gpuBackennd=mock"}, "gpuBackennd"},
		{"typo at the top", []string{"--set", "kubeletplugin.enabled=true"}, "kubeletplugin"},
		{"unknown backend", []string{"--set", "kubeletPlugin.gpuBackend=cuda"}, "gpuBackend"},
		{"bad memory size", []string{"--set", "kubeletPlugin.reservedMemory=lots"}, "reservedMemory"},
		{"too many time slices", []string{"--set", "kubeletPlugin.timeSlices=33"}, "timeSlices"},
		{"bad MIG mode", []string{"--set", "kubeletPlugin.migMode=auto"}, "migMode"},
		{"bad enforcement", []string{"--set", "deviceClasses.defaults.enforcement=strict"}, "enforcement"},
		{"auto is no floor", []string{"--set", "deviceClasses.defaults.minEnforcement=auto"}, "minEnforcement"},
		{"bad node floor", []string{"--set", "kubeletPlugin.minEnforcement=hard"}, "minEnforcement"},
		{"unknown queue resource", []string{"--set", "defaultQueue.resources.cpu.quota=1"}, "cpu"},
		{"relative interposer path", []string{"--set", "kubeletPlugin.interposerLibrary=libvgpu.so"}, "interposerLibrary"},
		{"pull policy", []string{"--set", "image.pullPolicy=Sometimes"}, "pullPolicy"},
		{"interposer install without an image", []string{"--set", "kubeletPlugin.interposer.install.enabled=true"}, "interposer.install.image"},
		{"interposer installed and named", []string{"--set", "kubeletPlugin.interposer.install.enabled=true", "--set", "kubeletPlugin.interposer.install.image=x/y:1", "--set", "kubeletPlugin.interposerLibrary=/lib/libvgpu.so"}, "not both"},
		{"relative dev root", []string{"--set", "kubeletPlugin.nvml.devRoot=dev"}, "devRoot"},
		{"relative hook path", []string{"--set", "kubeletPlugin.nvidiaCDIHookPath=nvidia-cdi-hook"}, "nvidiaCDIHookPath"},
		{"unknown CDI hook", []string{"--set", "kubeletPlugin.disabledCDIHooks={update-ld-cache}"}, "disabledCDIHooks"},
		{"two replicas without leader election", []string{"--set", "controller.replicas=2", "--set", "controller.leaderElection.enabled=false"}, "leaderElection"},
		{"grpc probes on a host port with seamless upgrades", []string{"--set", "kubeletPlugin.healthcheck.mode=grpc", "--set", "kubeletPlugin.hostNetwork=true"}, "use healthcheck.mode=exec"},
		{"webhook without controller", []string{"--set", "controller.enabled=false"}, "webhook.enabled"},
		{"canary without seamless upgrades", []string{"--set", "kubeletPlugin.canary.enabled=true", "--set", "kubeletPlugin.seamlessUpgrade=false"}, "canary.enabled=true needs kubeletPlugin.seamlessUpgrade"},
		{"canary without a node label", []string{"--set", "kubeletPlugin.canary.enabled=true", "--set-string", "kubeletPlugin.canary.nodeLabel="}, "nodeLabel"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"template", ReleaseName, ChartPath, "--kube-version", kubeVersion}, tc.set...)
			_, err := runHelm(t, args...)
			if err == nil {
				t.Fatalf("helm template %v succeeded; want an error naming %q", tc.set, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error does not name %q:\n%v", tc.want, err)
			}
		})
	}
	t.Run("kubernetes too old", func(t *testing.T) {
		_, err := runHelm(t, "template", ReleaseName, ChartPath, "--kube-version", "1.33.0")
		if err == nil || !strings.Contains(err.Error(), "kubeVersion") {
			t.Errorf("Kubernetes 1.33 accepted (no DRA v1): %v", err)
		}
	})
}

// TestNotes renders NOTES.txt (helm template does not) and checks it tells
// the user what to try first.
func TestNotes(t *testing.T) {
	out, err := runHelm(t, "install", ReleaseName, ChartPath, "--dry-run=client", "--namespace", DefaultNamespace,
		"--values", MockValuesPath)
	if err != nil {
		t.Fatal(err)
	}
	_, notes, ok := strings.Cut(out, "NOTES:\n")
	if !ok {
		t.Fatalf("no NOTES in dry-run output:\n%s", out)
	}
	for _, want := range []string{
		"kubectl -n tessera-system rollout status daemonset/" + pluginName,
		"kubectl get resourceslices --field-selector spec.driver=gpu.tessera.dev",
		"MOCK GPUs: t4:2",
		"deviceClassName: gpu.tessera.dev",
		"tessera.dev/queue: default",
		"kubectl get queues",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("NOTES lacks %q:\n%s", want, notes)
		}
	}
}

var flagRE = regexp.MustCompile(`(?m)^\s+(?:-[a-zA-Z], )?--([a-z0-9][a-z0-9_-]*)`)

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
