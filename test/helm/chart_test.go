package helm

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

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

var flagRE = regexp.MustCompile(`(?m)^\s+(?:-[a-zA-Z], )?--([a-z0-9][a-z0-9_-]*)`)
