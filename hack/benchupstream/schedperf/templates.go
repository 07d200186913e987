package schedperf

import (
	"bytes"
	"context"
	"fmt"
	"path"
	"strings"
	"text/template"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/deployments"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/nodeslices"
)

const (
	// PackageDir is where the generated test package lives in the tree.
	PackageDir = "test/integration/scheduler_perf/tessera"
	// NodePrefix is the name of scheduler_perf's DRA nodes without their
	// index (upstream's templates/node-with-dra-test-driver.yaml).
	NodePrefix = "scheduler-perf-dra-"
	// ClassName is Tessera's DeviceClass for GPUs and memory shares.
	ClassName = "gpu.tessera.dev"
	// claimTemplateName is the name upstream's pod template refers to
	// (templates/pod-with-claim-template.yaml).
	claimTemplateName = "test-claim-template"
	// Label selects the generated workloads (-perf-scheduling-label-filter).
	Label = "bench-upstream"
	// Topic is the topic name of the results file.
	Topic = "tessera"
)

// The test cases, in the order they run.
const (
	CaseUpstream = "UpstreamTestDriverWithResourceClaimTemplate"
	CaseTessera  = "TesseraSharesWithResourceClaimTemplate"
	CasePlain    = "SchedulingBasic"
)

// Config is the size and shape of one benchmark run.
type Config struct {
	// Profile is the mock GPU profile of every node (pkg/gpu/nvmlmock).
	Profile string
	// Share is the GPU memory each Tessera claim asks for.
	Share string
	// Nodes, InitPods and MeasurePods are the sizes of every case: the
	// DRA cases allocate InitPods claims before they measure (upstream's
	// initClaims), the plain case schedules InitPods pods first.
	Nodes, InitPods, MeasurePods int
}

// Workload is the workload name of every case at this size.
func (c Config) Workload() string {
	return fmt.Sprintf("%dpods_%dnodes", c.InitPods+c.MeasurePods, c.Nodes)
}

// Validate says which field is unusable.
func (c Config) Validate() error {
	switch {
	case c.Profile == "":
		return fmt.Errorf("profile is empty: name a mock GPU profile, e.g. dgxh100")
	case c.Nodes < 1:
		return fmt.Errorf("nodes = %d: need at least 1", c.Nodes)
	case c.InitPods < 0:
		return fmt.Errorf("init pods = %d: must not be negative", c.InitPods)
	case c.MeasurePods < 1:
		return fmt.Errorf("measured pods = %d: need at least 1", c.MeasurePods)
	}
	if _, err := resource.ParseQuantity(c.Share); err != nil {
		return fmt.Errorf("share %q: %w (e.g. 8Gi)", c.Share, err)
	}
	return nil
}

// SliceTemplates returns the ResourceSlices the kubelet plugin publishes for
// a node of profile, one scheduler_perf template (YAML with {{.Index}}) per
// slice. They are the plugin's own slices (nodeslices.MockProfile, seeded with
// node 0's name) with the node's name replaced by NodePrefix{{.Index}}, so
// every node publishes them under its own name and pool; attributes the mock
// seeds per node (UUIDs) are node 0's on every node.
func SliceTemplates(ctx context.Context, profile string) ([][]byte, error) {
	node := NodePrefix + "0"
	n, err := nodeslices.MockProfile(ctx, profile, node)
	if err != nil {
		return nil, err
	}
	slices := n.Slices
	if len(slices) == 0 {
		return nil, fmt.Errorf("mock profile %q publishes no ResourceSlice", profile)
	}
	var out [][]byte
	for _, s := range slices {
		s.TypeMeta = metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceSlice"}
		data, err := yaml.Marshal(s)
		if err != nil {
			return nil, err
		}
		if bytes.Contains(data, []byte("{{")) {
			return nil, fmt.Errorf("slice %s contains {{, which scheduler_perf would read as a template", s.Name)
		}
		out = append(out, bytes.ReplaceAll(data, []byte(node), []byte(NodePrefix+"{{.Index}}")))
	}
	return out, nil
}

// DeviceClass is Tessera's shipped gpu.tessera.dev DeviceClass (the chart's,
// deployments/deviceclasses.yaml) as YAML.
func DeviceClass() ([]byte, error) {
	classes, err := deployments.DeviceClasses()
	if err != nil {
		return nil, err
	}
	for _, c := range classes {
		if c.Name == ClassName {
			c.TypeMeta = metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass"}
			return yaml.Marshal(c)
		}
	}
	return nil, fmt.Errorf("deployments/deviceclasses.yaml has no DeviceClass %s", ClassName)
}

// ShareClaimSpec is the claim of one Tessera share pod, as the scale harness
// and the demos ask it: one device of gpu.tessera.dev with share of its
// consumable memory capacity.
func ShareClaimSpec(share string) (resourceapi.ResourceClaimSpec, error) {
	q, err := resource.ParseQuantity(share)
	if err != nil {
		return resourceapi.ResourceClaimSpec{}, fmt.Errorf("share %q: %w", share, err)
	}
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: ClassName,
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
				devicemodel.CapMemory: q,
			}},
		}}},
	}}, nil
}

// claimYAML are the template of the measured pods' claims and the template
// of the claims allocated before the measurement (named per index).
func claimYAML(share string) (tmpl, claim []byte, err error) {
	spec, err := ShareClaimSpec(share)
	if err != nil {
		return nil, nil, err
	}
	gv := resourceapi.SchemeGroupVersion.String()
	tmpl, err = yaml.Marshal(&resourceapi.ResourceClaimTemplate{
		TypeMeta:   metav1.TypeMeta{APIVersion: gv, Kind: "ResourceClaimTemplate"},
		ObjectMeta: metav1.ObjectMeta{Name: claimTemplateName},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: spec},
	})
	if err != nil {
		return nil, nil, err
	}
	claim, err = yaml.Marshal(&resourceapi.ResourceClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: gv, Kind: "ResourceClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: "tessera-claim-{{.Index}}"},
		Spec:       spec,
	})
	return tmpl, claim, err
}

// Generate returns the files of the generated scheduler_perf package, by
// path relative to the tree's root: its test, its performance-config.yaml
// with the three cases, and Tessera's templates.
func Generate(ctx context.Context, cfg Config) (map[string][]byte, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	slices, err := SliceTemplates(ctx, cfg.Profile)
	if err != nil {
		return nil, err
	}
	class, err := DeviceClass()
	if err != nil {
		return nil, err
	}
	tmpl, claim, err := claimYAML(cfg.Share)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"templates/deviceclass.yaml":           class,
		"templates/resourceclaimtemplate.yaml": tmpl,
		"templates/resourceclaim.yaml":         claim,
		"tessera_test.go":                      []byte(testGo),
	}
	var slicePaths []string
	for i, s := range slices {
		p := fmt.Sprintf("templates/resourceslice-%s-%d.yaml", cfg.Profile, i)
		files[p] = s
		slicePaths = append(slicePaths, p)
	}
	var conf bytes.Buffer
	if err := configTemplate.Execute(&conf, struct {
		Config
		Workload, Label                      string
		CaseUpstream, CaseTessera, CasePlain string
		TesseraSlices                        []string
	}{cfg, cfg.Workload(), Label, CaseUpstream, CaseTessera, CasePlain, slicePaths}); err != nil {
		return nil, err
	}
	files["performance-config.yaml"] = conf.Bytes()
	out := make(map[string][]byte, len(files))
	for p, data := range files {
		out[path.Join(PackageDir, p)] = data
	}
	return out, nil
}

// configTemplate writes the three cases. The first is upstream's
// SchedulingWithResourceClaimTemplate (test/integration/scheduler_perf/dra)
// step for step with upstream's own templates; the second is the same steps
// with Tessera's slices, class and claims; the third is SchedulingBasic
// (misc) on the same nodes. Paths are relative to the package directory,
// where scheduler_perf runs.
var configTemplate = template.Must(template.New("config").Parse(strings.TrimLeft(`
# Generated by make bench-upstream (hack/benchupstream); rewritten on every run.
- name: {{.CaseUpstream}}
  featureGates:
    DynamicResourceAllocation: true
  workloadTemplate:
  - opcode: createNodes
    nodeTemplatePath: ../dra/templates/node-with-dra-test-driver.yaml
    countParam: $nodes
  - opcode: createAny
    templatePath: ../dra/templates/resourceslice-basic-devices.yaml
    countParam: $nodes
    templateParams:
      numPCIRoots: 2
      numDevices: 10
  - opcode: createAny
    templatePath: ../dra/templates/deviceclass.yaml
  - opcode: createAny
    templatePath: ../dra/templates/resourceclaim.yaml
    countParam: $initClaims
    namespace: init
  - opcode: allocResourceClaims
    namespace: init
  - opcode: createAny
    templatePath: ../dra/templates/resourceclaimtemplate.yaml
    namespace: test
    templateParams:
      numRequests: 1
  - opcode: createPods
    namespace: test
    countParam: $measurePods
    podTemplatePath: ../dra/templates/pod-with-claim-template.yaml
    collectMetrics: true
  workloads:
  - name: {{.Workload}}
    labels: [{{.Label}}]
    params:
      nodes: {{.Nodes}}
      initClaims: {{.InitPods}}
      measurePods: {{.MeasurePods}}
- name: {{.CaseTessera}}
  featureGates:
    DynamicResourceAllocation: true
    DRAConsumableCapacity: true
    DRAPartitionableDevices: true
  workloadTemplate:
  - opcode: createNodes
    nodeTemplatePath: ../dra/templates/node-with-dra-test-driver.yaml
    countParam: $nodes
{{- range .TesseraSlices}}
  - opcode: createAny
    templatePath: {{.}}
    countParam: $nodes
{{- end}}
  - opcode: createAny
    templatePath: templates/deviceclass.yaml
  - opcode: createAny
    templatePath: templates/resourceclaim.yaml
    countParam: $initClaims
    namespace: init
  - opcode: allocResourceClaims
    namespace: init
  - opcode: createAny
    templatePath: templates/resourceclaimtemplate.yaml
    namespace: test
  - opcode: createPods
    namespace: test
    countParam: $measurePods
    podTemplatePath: ../dra/templates/pod-with-claim-template.yaml
    collectMetrics: true
  workloads:
  - name: {{.Workload}}
    labels: [{{.Label}}]
    params:
      nodes: {{.Nodes}}
      initClaims: {{.InitPods}}
      measurePods: {{.MeasurePods}}
- name: {{.CasePlain}}
  defaultPodTemplatePath: ../templates/pod-default.yaml
  workloadTemplate:
  - opcode: createNodes
    nodeTemplatePath: ../dra/templates/node-with-dra-test-driver.yaml
    countParam: $nodes
  - opcode: createPods
    countParam: $initPods
  - opcode: createPods
    countParam: $measurePods
    collectMetrics: true
  workloads:
  - name: {{.Workload}}
    labels: [{{.Label}}]
    params:
      nodes: {{.Nodes}}
      initPods: {{.InitPods}}
      measurePods: {{.MeasurePods}}
`, "\n")))

// testGo is the generated package's test: scheduler_perf's benchmark over
// performance-config.yaml with the allocator upstream benchmarks DRA with.
const testGo = `// Code generated by make bench-upstream (hack/benchupstream in
// github.com/tessera-dev/tessera); rewritten on every run. DO NOT EDIT.

package tessera

import (
	"fmt"
	"os"
	"testing"

	"k8s.io/dynamic-resource-allocation/structured"
	perf "k8s.io/kubernetes/test/integration/scheduler_perf"
)

func TestMain(m *testing.M) {
	if err := perf.InitTests(); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n", err)
		os.Exit(1)
	}
	m.Run()
}

// BenchmarkPerfScheduling runs every case of performance-config.yaml that
// -perf-scheduling-label-filter selects, with the allocator the dra
// package's BenchmarkPerfScheduling uses.
func BenchmarkPerfScheduling(b *testing.B) {
	structured.EnableAllocators("incubating")
	defer structured.EnableAllocators()
	perf.RunBenchmarkPerfScheduling(b, "performance-config.yaml", "` + Topic + `", nil)
}
`
