package nodeslices_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/nodeslices"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
)

// BenchmarkPublishDGXH100DynamicMIG measures discovery, the device model and
// rendering of an 8 x H100 node in dynamic MIG mode, and reports the
// objects and JSON bytes the API server receives.
func BenchmarkPublishDGXH100DynamicMIG(b *testing.B) {
	spec, _ := nvmlmock.ParseProfile("dgxh100")
	srv, err := nvmlmock.New(nvmlmock.Options{Spec: spec, Seed: "bench", MIGEnabled: true})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	cfg := devicemodel.DefaultConfig()
	var objects, bytes, devices int
	for b.Loop() {
		n, err := nodeslices.Build(ctx, srv, cfg, "bench-node")
		if err != nil {
			b.Fatal(err)
		}
		rs := n.Slices
		objects, bytes, devices = len(rs), 0, 0
		for _, s := range rs {
			data, err := json.Marshal(s)
			if err != nil {
				b.Fatal(err)
			}
			bytes += len(data)
			devices += len(s.Spec.Devices)
		}
	}
	b.ReportMetric(float64(objects), "slices")
	b.ReportMetric(float64(devices), "devices")
	b.ReportMetric(float64(bytes), "json-bytes")
}
