package publish_test

import (
	"context"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
	"github.com/tessera-dev/tessera/pkg/node/publish"
)

type recorder struct {
	published []resourceslice.DriverResources
}

func (r *recorder) sink(_ context.Context, res resourceslice.DriverResources) error {
	r.published = append(r.published, res)
	return nil
}

func devices(res resourceslice.DriverResources) []string {
	var out []string
	for _, pool := range res.Pools {
		for _, s := range pool.Slices {
			for _, d := range s.Devices {
				out = append(out, d.Name)
			}
		}
	}
	return out
}

// brokenLib fails discovery when broken is set.
type brokenLib struct {
	*nvmlmock.Server
	broken bool
}

func (b *brokenLib) DeviceGetCount() (int, nvml.Return) {
	if b.broken {
		return 0, nvml.ERROR_GPU_IS_LOST
	}
	return b.Server.DeviceGetCount()
}

func TestPublisherRepublishesOnlyOnChange(t *testing.T) {
	ctx := context.Background()
	spec, _ := nvmlmock.ParseProfile("h100-80gb")
	srv, err := nvmlmock.New(nvmlmock.Options{Spec: spec, MIGEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	lib := &brokenLib{Server: srv}
	cfg := devicemodel.Config{MIGMode: devicemodel.MIGStatic, ReservedMemory: devicemodel.DefaultReservedMemory}
	rec := &recorder{}
	p := publish.NewPublisher(lib, "node-1", func() devicemodel.Config { return cfg }, rec.sink)

	if err := p.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(rec.published) != 1 || len(devices(rec.published[0])) != 0 {
		t.Fatalf("first sync: %d publications, devices %v; want one empty pool", len(rec.published), rec.published)
	}
	if err := p.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(rec.published) != 1 {
		t.Fatalf("unchanged inventory republished")
	}

	// A MIG instance appears (static mode): republish with it.
	dev := srv.Devices()[0]
	info, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 6, Size: 1})
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ciInfo, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if err := p.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(rec.published) != 2 || len(devices(rec.published[1])) != 1 || devices(rec.published[1])[0] != "gpu-0-mig-1g10gb-6" {
		t.Fatalf("after MIG instance appeared: %v", rec.published)
	}

	// NVML fails: the error surfaces, nothing is republished, the last
	// good inventory stays.
	lib.broken = true
	if err := p.Sync(ctx); err == nil {
		t.Fatal("want the discovery error")
	}
	if len(rec.published) != 2 || p.Inventory() == nil || len(p.Inventory().GPUs[0].MIGInstances) != 1 {
		t.Fatal("failed rescan disturbed the published slices or the inventory")
	}

	// A configuration change (a health taint) republishes.
	lib.broken = false
	cfg.Taints = map[string][]resourceapi.DeviceTaint{"gpu-0-mig-1g10gb-6": {{Key: "gpu.tessera.dev/unhealthy", Effect: resourceapi.DeviceTaintEffectNoSchedule}}}
	if err := p.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(rec.published) != 3 {
		t.Fatalf("taint change not republished")
	}
	got := rec.published[2].Pools["node-1"].Slices[0].Devices[0].Taints
	if len(got) != 1 || got[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Fatalf("taints %v", got)
	}
}
