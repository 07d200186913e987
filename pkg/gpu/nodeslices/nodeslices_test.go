package nodeslices_test

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/nodeslices"
)

// A mock node's slices form one pool named after the node, all counted in
// it; the mock seeds UUIDs with the node's name, so the same node
// publishes the same slices and another node other UUIDs.
func TestMockProfile(t *testing.T) {
	ctx := context.Background()
	for _, profile := range []string{"t4:2", "dgxh100", "t4:1,h100-80gb:1"} {
		t.Run(profile, func(t *testing.T) {
			a, err := nodeslices.MockProfile(ctx, profile, "node-a")
			if err != nil {
				t.Fatal(err)
			}
			if len(a.Slices) == 0 || len(a.Inventory.GPUs) == 0 {
				t.Fatalf("%d slices, %d GPUs", len(a.Slices), len(a.Inventory.GPUs))
			}
			for _, s := range a.Slices {
				if s.Spec.Pool.Name != "node-a" || *s.Spec.NodeName != "node-a" || s.Spec.Driver != devicemodel.DriverName ||
					s.Spec.Pool.ResourceSliceCount != int64(len(a.Slices)) || !strings.HasSuffix(s.Name, "-node-a") {
					t.Errorf("slice %s: pool %+v node %s driver %s", s.Name, s.Spec.Pool, *s.Spec.NodeName, s.Spec.Driver)
				}
			}
			again, err := nodeslices.MockProfile(ctx, profile, "node-a")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a.Slices, again.Slices) {
				t.Error("the same node published other slices")
			}
			b, err := nodeslices.MockProfile(ctx, profile, "node-b")
			if err != nil {
				t.Fatal(err)
			}
			if a.Inventory.GPUs[0].UUID == b.Inventory.GPUs[0].UUID {
				t.Error("two nodes have the same GPU UUID")
			}
		})
	}
	if _, err := nodeslices.MockProfile(ctx, "nosuchgpu", "n"); err == nil {
		t.Error("an unknown profile built a node")
	}
}
