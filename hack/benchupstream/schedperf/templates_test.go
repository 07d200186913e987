package schedperf

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"text/template"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/deployments"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/nodeslices"
)

// render executes a generated template the way scheduler_perf's createAny
// does for object index i ({{.Index}}).
func render(t *testing.T, tmpl []byte, i int, into any) {
	t.Helper()
	tp, err := template.New("t").Parse(string(tmpl))
	if err != nil {
		t.Fatalf("not a template: %v", err)
	}
	var b bytes.Buffer
	if err := tp.Execute(&b, map[string]any{"Index": i}); err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b.Bytes(), into); err != nil {
		t.Fatalf("rendered template: %v\n%s", err, b.String())
	}
}

func asYAML(v any) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return err.Error()
	}
	return string(data)
}

// withoutUUIDs drops the attributes the mock seeds per node.
func withoutUUIDs(slices []*resourceapi.ResourceSlice) {
	for _, s := range slices {
		for i := range s.Spec.Devices {
			delete(s.Spec.Devices[i].Attributes, "uuid")
		}
	}
}

func TestSliceTemplatesAreThePluginsOwn(t *testing.T) {
	ctx := context.Background()
	for _, profile := range []string{"dgxh100", "t4:2"} {
		for _, index := range []int{0, 3, 499} {
			t.Run(fmt.Sprintf("%s/node %d", profile, index), func(t *testing.T) {
				tmpls, err := SliceTemplates(ctx, profile)
				if err != nil {
					t.Fatal(err)
				}
				node := fmt.Sprintf("%s%d", NodePrefix, index)
				n, err := nodeslices.MockProfile(ctx, profile, node)
				if err != nil {
					t.Fatal(err)
				}
				want := n.Slices
				if len(tmpls) != len(want) {
					t.Fatalf("%d templates, the plugin publishes %d slices", len(tmpls), len(want))
				}
				var got []*resourceapi.ResourceSlice
				for _, tmpl := range tmpls {
					var s resourceapi.ResourceSlice
					render(t, tmpl, index, &s)
					if s.Kind != "ResourceSlice" || s.APIVersion != "resource.k8s.io/v1" {
						t.Errorf("kind %s, apiVersion %s: scheduler_perf needs both", s.Kind, s.APIVersion)
					}
					got = append(got, &s)
				}
				if *got[0].Spec.NodeName != node || got[0].Spec.Pool.Name != node {
					t.Errorf("node %q, pool %q; want both %q", *got[0].Spec.NodeName, got[0].Spec.Pool.Name, node)
				}
				if index != 0 { // node 0's UUIDs on every node
					withoutUUIDs(got)
					withoutUUIDs(want)
				}
				// Compared as the API server receives them (omitempty
				// makes nil and empty the same).
				if asYAML(got) != asYAML(want) {
					t.Errorf("rendered slices differ from the plugin's:\n%s\nplugin's:\n%s", asYAML(got), asYAML(want))
				}
			})
		}
	}
}

func TestGeneratedClaimsFitTessera(t *testing.T) {
	ctx := context.Background()
	cfg := Config{Profile: "dgxh100", Share: "8Gi", Nodes: 500, InitPods: 2500, MeasurePods: 2500}
	files, err := Generate(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	file := func(p string) []byte {
		t.Helper()
		data, ok := files[PackageDir+"/"+p]
		if !ok {
			t.Fatalf("Generate() wrote no %s", p)
		}
		return data
	}
	const index = 7
	var nodeSlices []*resourceapi.ResourceSlice
	for p, data := range files {
		if strings.Contains(p, "/templates/resourceslice-") {
			var s resourceapi.ResourceSlice
			render(t, data, index, &s)
			nodeSlices = append(nodeSlices, &s)
		}
	}
	var class resourceapi.DeviceClass
	if err := yaml.UnmarshalStrict(file("templates/deviceclass.yaml"), &class); err != nil {
		t.Fatal(err)
	}
	shipped, err := deployments.DeviceClasses()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range shipped {
		if c.Name == ClassName {
			if asYAML(c) != asYAML(&class) {
				t.Errorf("DeviceClass differs from the shipped one:\n%s\nshipped:\n%s", asYAML(&class), asYAML(c))
			}
		}
	}
	var tmpl resourceapi.ResourceClaimTemplate
	if err := yaml.UnmarshalStrict(file("templates/resourceclaimtemplate.yaml"), &tmpl); err != nil {
		t.Fatal(err)
	}
	if tmpl.Name != claimTemplateName {
		t.Errorf("template %q: upstream's pod template refers to %q", tmpl.Name, claimTemplateName)
	}
	var initClaim resourceapi.ResourceClaim
	render(t, file("templates/resourceclaim.yaml"), index, &initClaim)
	if !apiequality.Semantic.DeepEqual(tmpl.Spec.Spec, initClaim.Spec) {
		t.Errorf("the claims allocated first ask otherwise than the measured ones:\n%s\n%s", asYAML(initClaim.Spec), asYAML(tmpl.Spec.Spec))
	}

	// As many shares fit on a node as its GPUs' memory holds, with the
	// scheduler's own allocator.
	share := tmpl.Spec.Spec.Devices.Requests[0].Exactly.Capacity.Requests[devicemodel.CapMemory]
	want := 0
	for _, s := range nodeSlices {
		for _, d := range s.Spec.Devices {
			c := d.Capacity[devicemodel.CapMemory].Value
			want += int(c.Value() / share.Value())
		}
	}
	if want == 0 {
		t.Fatalf("no %s share fits the slices by capacity: the test proves nothing", share.String())
	}
	alloc := allocation.NewAllocator(nodeSlices, allocation.Classes{&class})
	state := allocation.NewState()
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s%d", NodePrefix, index)}}
	got := 0
	for ; got <= want; got++ {
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%d", got), Namespace: "test", UID: types.UID(fmt.Sprint("u", got))}, Spec: tmpl.Spec.Spec}
		// What the API server defaults a request to.
		claim.Spec.Devices.Requests[0].Exactly.AllocationMode = resourceapi.DeviceAllocationModeExactCount
		claim.Spec.Devices.Requests[0].Exactly.Count = 1
		res, err := alloc.Allocate(ctx, node, state, claim)
		if err != nil {
			t.Fatal(err)
		}
		if res == nil {
			break
		}
		state.Add(&res[0])
	}
	if got != want {
		t.Errorf("%d %s claims fit on a node, want %d (its GPUs' memory)", got, share.String(), want)
	}
	if cfg.InitPods+cfg.MeasurePods > want*cfg.Nodes {
		t.Errorf("%d pods do not fit %d nodes of %d shares", cfg.InitPods+cfg.MeasurePods, cfg.Nodes, want)
	}
}

func TestGenerateConfig(t *testing.T) {
	cfg := Config{Profile: "dgxh100", Share: "8Gi", Nodes: 20, InitPods: 30, MeasurePods: 40}
	files, err := Generate(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Name             string
		FeatureGates     map[string]bool
		WorkloadTemplate []map[string]any
		Workloads        []struct {
			Name   string
			Labels []string
			Params map[string]int
		}
	}
	if err := yaml.Unmarshal(files[PackageDir+"/performance-config.yaml"], &cases); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cases {
		names = append(names, c.Name)
		if len(c.Workloads) != 1 || c.Workloads[0].Name != "70pods_20nodes" || c.Workloads[0].Labels[0] != Label {
			t.Errorf("%s: workloads %+v, want one 70pods_20nodes labelled %s", c.Name, c.Workloads, Label)
			continue
		}
		if p := c.Workloads[0].Params; p["nodes"] != 20 || p["measurePods"] != 40 || p["initClaims"]+p["initPods"] != 30 {
			t.Errorf("%s: params %v", c.Name, p)
		}
		for _, op := range c.WorkloadTemplate {
			for _, k := range []string{"templatePath", "podTemplatePath", "nodeTemplatePath"} {
				p, ok := op[k].(string)
				if !ok || strings.HasPrefix(p, "../") {
					continue // upstream's own templates
				}
				if _, ok := files[PackageDir+"/"+p]; !ok {
					t.Errorf("%s: %s %s is not generated", c.Name, k, p)
				}
			}
		}
	}
	if want := []string{CaseUpstream, CaseTessera, CasePlain}; !slices.Equal(names, want) {
		t.Errorf("cases %q, want %q", names, want)
	}
	if !cases[1].FeatureGates["DRAConsumableCapacity"] {
		t.Errorf("Tessera's case does not turn on DRAConsumableCapacity: %v", cases[1].FeatureGates)
	}
	for _, bad := range []Config{{Share: "8Gi", Nodes: 1, MeasurePods: 1}, {Profile: "dgxh100", Share: "lots", Nodes: 1, MeasurePods: 1}, {Profile: "dgxh100", Share: "8Gi", MeasurePods: 1}} {
		if _, err := Generate(context.Background(), bad); err == nil {
			t.Errorf("Generate(%+v): no error", bad)
		}
	}
}
