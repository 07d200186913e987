package scenario

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
	"github.com/tessera-dev/tessera/test/testutil"
)

// demo/topology (run by the e2e, not by the harness: its NIC needs a
// kubelet plugin of its own) relies on the mock's t4:4 topology: nic-0
// shares gpu-2's and gpu-3's PCIe root, nic-1 shares no GPU's. A change of
// the mock's topology must change the demo too.
func TestTopologyDemoMatchesTheMock(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testutil.Root(t), "demo", "topology", "10-nic.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sch := runtime.NewScheme()
	if err := scheme.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	decoder := serializer.NewCodecFactory(sch).UniversalDeserializer()
	roots := map[string]string{}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		obj, _, err := decoder.Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("10-nic.yaml: %v", err)
		}
		if s, ok := obj.(*resourceapi.ResourceSlice); ok {
			for _, d := range s.Spec.Devices {
				if a, ok := d.Attributes[devicemodel.AttrPCIeRoot]; ok && a.StringValue != nil {
					roots[d.Name] = *a.StringValue
				}
			}
		}
	}
	gpuRoots := map[string]int{}
	for i := range 4 {
		root, _ := nvmlmock.Topology(i, 4)
		gpuRoots[root] |= 1 << i
	}
	if got := gpuRoots[roots["nic-0"]]; got != 1<<2|1<<3 {
		t.Errorf("nic-0's root %q holds GPUs %04b of t4:4, want gpu-2 and gpu-3 (the README says so)", roots["nic-0"], got)
	}
	if roots["nic-1"] == "" || gpuRoots[roots["nic-1"]] != 0 {
		t.Errorf("nic-1's root %q holds GPUs %04b of t4:4, want none", roots["nic-1"], gpuRoots[roots["nic-1"]])
	}
}
