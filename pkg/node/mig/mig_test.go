package mig

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-dev/tessera/pkg/gpu/discover"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
)

func setup(t *testing.T, statePath string) (*Manager, *inventory.Inventory) {
	t.Helper()
	spec, err := nvmlmock.ParseProfile("a100-40gb")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := nvmlmock.New(nvmlmock.Options{Spec: spec, Seed: "n", MIGEnabled: true, StatePath: statePath})
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	inv, err := discover.Discover(ctx, srv)
	if err != nil {
		t.Fatal(err)
	}
	return New(srv), inv
}

func profile(t *testing.T, gpu inventory.GPU, name string) inventory.MIGProfile {
	for _, p := range gpu.MIGProfiles {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no profile %s", name)
	return inventory.MIGProfile{}
}

func TestCreateFindDestroy(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	state := filepath.Join(t.TempDir(), "state.json")
	m, inv := setup(t, state)
	gpu := inv.GPUs[0]
	tmpl, err := Template(gpu, profile(t, gpu, "1g.5gb"), 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Template(gpu, profile(t, gpu, "3g.20gb"), 3); err == nil {
		t.Error("placement 3 accepted for 3g.20gb")
	}
	unlock := m.Lock(gpu.UUID)
	defer unlock()
	if got, err := m.Find(ctx, tmpl); err != nil || got != nil {
		t.Fatalf("found %v %v before creation", got, err)
	}
	var recorded Instance
	inst, err := m.Create(ctx, tmpl, func(i Instance) error { recorded = i; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if !inst.Created || inst.GIID < 0 || inst.CIID < 0 || inst.UUID == "" || recorded.GIID != inst.GIID {
		t.Fatalf("created %+v, recorded %+v", inst, recorded)
	}
	found, err := m.Find(ctx, tmpl)
	if err != nil || found == nil || found.UUID != inst.UUID || found.GIID != inst.GIID {
		t.Fatalf("find: %+v %v", found, err)
	}
	// An overlapping placement cannot be created.
	big, _ := Template(gpu, profile(t, gpu, "4g.20gb"), 0)
	if _, err := m.Create(ctx, big, nil); err == nil {
		t.Fatal("overlapping instance created")
	}
	// The instance survives a restart of the plugin (the mock persists it).
	m2, _ := setup(t, state)
	if got, err := m2.Find(ctx, tmpl); err != nil || got == nil || got.UUID != inst.UUID {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	if err := m.Destroy(ctx, *inst); err != nil {
		t.Fatal(err)
	}
	if err := m.Destroy(ctx, *inst); err != nil {
		t.Fatalf("destroying twice: %v", err)
	}
	if all, err := m.List(ctx, gpu.UUID); err != nil || len(all) != 0 {
		t.Fatalf("left %v %v", all, err)
	}
}

func TestDestroyLeavesReusedID(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, inv := setup(t, "")
	gpu := inv.GPUs[0]
	unlock := m.Lock(gpu.UUID)
	defer unlock()
	a, _ := Template(gpu, profile(t, gpu, "1g.5gb"), 0)
	inst, err := m.Create(ctx, a, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Pretend the record says this ID was a different placement.
	stale := *inst
	stale.Start = 6
	if err := m.Destroy(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if all, _ := m.List(ctx, gpu.UUID); len(all) != 1 {
		t.Fatalf("instance of another placement destroyed: %v", all)
	}
}

func TestEnsureCIAndFailedRecord(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, inv := setup(t, "")
	gpu := inv.GPUs[0]
	unlock := m.Lock(gpu.UUID)
	defer unlock()
	tmpl, _ := Template(gpu, profile(t, gpu, "2g.10gb"), 2)
	// A failure to record the GPU instance undoes it.
	if inst, err := m.Create(ctx, tmpl, func(Instance) error { return context.Canceled }); err == nil || inst != nil {
		t.Fatalf("create with failing record: %v %v", inst, err)
	}
	if found, _ := m.Find(ctx, tmpl); found != nil {
		t.Fatalf("left %+v", found)
	}
	// Simulate a crash between the GPU and the compute instance.
	dev, _ := m.device(gpu.UUID)
	info, _ := dev.GetGpuInstanceProfileInfo(tmpl.GIProfileID)
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 2, Size: 2}); ret != nvml.SUCCESS {
		t.Fatalf("create GI: %v", ret)
	}
	found, err := m.Find(ctx, tmpl)
	if err != nil || found == nil || found.CIID != -1 {
		t.Fatalf("GPU instance without compute instance: %+v %v", found, err)
	}
	if err := m.EnsureCI(ctx, found); err != nil {
		t.Fatal(err)
	}
	if found.CIID < 0 || found.UUID == "" {
		t.Fatalf("after EnsureCI: %+v", found)
	}
}
