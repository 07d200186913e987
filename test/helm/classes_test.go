package helm

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"

	tesserav1alpha1 "github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/deployments"
	"github.com/tessera-dev/tessera/test/testutil"
)

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
