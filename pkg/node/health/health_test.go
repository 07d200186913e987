package health

import (
	"context"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/discover"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
)

func setup(t *testing.T, profile string, mig bool) (context.Context, *nvmlmock.Server, *inventory.Inventory, []string) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	spec, err := nvmlmock.ParseProfile(profile)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := nvmlmock.New(nvmlmock.Options{Spec: spec, Seed: "n", MIGEnabled: mig})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := discover.Discover(ctx, srv)
	if err != nil {
		t.Fatal(err)
	}
	slices, err := devicemodel.Build(inv, devicemodel.Config{ReservedMemory: devicemodel.DefaultReservedMemory, TimeSlices: 2, MIGMode: devicemodel.MIGDynamic})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range slices {
		for _, d := range s.Devices {
			names = append(names, d.Name)
		}
	}
	return ctx, srv, inv, names
}

func TestCriticalXIDMakesGPUUnhealthy(t *testing.T) {
	ctx, srv, inv, names := setup(t, "t4:2", false)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	changed := make(chan struct{}, 10)
	m := New(srv, "node", Options{IgnoredXIDs: DefaultIgnoredXIDs, OnChange: func() { changed <- struct{}{} }})
	reports := make(chan kubeletplugin.DeviceHealthReport, 10)
	go func() { _ = m.Run(ctx, inv) }()
	go func() { _ = m.Watch(ctx, reports, func() (*inventory.Inventory, []string) { return inv, names }) }()

	first := <-reports
	if len(first.Devices) != len(names) {
		t.Fatalf("first report covers %d of %d devices", len(first.Devices), len(names))
	}
	for _, d := range first.Devices {
		if d.Health != kubeletplugin.HealthStatusHealthy || d.PoolName != "node" || d.HealthCheckTimeout != HealthCheckTimeout {
			t.Errorf("initially %+v", d)
		}
	}
	// An application error only gives an informational taint.
	if err := srv.InjectXID(inv.GPUs[1].UUID, 13); err != nil {
		t.Fatal(err)
	}
	if err := srv.InjectXID(inv.GPUs[1].UUID, 79); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case <-changed:
		case <-time.After(5 * time.Second):
			t.Fatal("no change reported")
		}
	}
	var report kubeletplugin.DeviceHealthReport
	for ok := true; ok; {
		report = <-reports
		for _, d := range report.Devices {
			ok = ok && (d.DeviceName != "gpu-1" || d.Health == kubeletplugin.HealthStatusHealthy)
		}
	}
	for _, d := range report.Devices {
		wantHealthy := d.DeviceName == "gpu-0" || d.DeviceName == "gpu-0-ts-0" || d.DeviceName == "gpu-0-ts-1"
		if (d.Health == kubeletplugin.HealthStatusHealthy) != wantHealthy {
			t.Errorf("%s: %s (%s)", d.DeviceName, d.Health, d.Message)
		}
		if !wantHealthy && d.Message == "" {
			t.Errorf("%s unhealthy without a message", d.DeviceName)
		}
	}
	taints := m.Taints(inv, names)
	if len(taints) != 3 {
		t.Fatalf("taints %v", taints)
	}
	got := taints["gpu-1-ts-1"]
	if len(got) != 2 || got[0].TimeAdded == nil || got[1].TimeAdded == nil {
		t.Fatalf("taints %+v", got)
	}
	if got[0].Key != KeyAppXID || got[0].Value != "xid-13" || got[0].Effect != resourceapi.DeviceTaintEffectNone ||
		got[1].Key != KeyGPULost || got[1].Value != "xid-79" || got[1].Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Errorf("taints %+v", got)
	}
}

func TestMIGInstanceXID(t *testing.T) {
	ctx, srv, inv, names := setup(t, "a100-40gb", true)
	gpu := inv.GPUs[0]
	dev, _ := srv.DeviceGetHandleByUUID(gpu.UUID)
	var prof inventory.MIGProfile
	for _, p := range gpu.MIGProfiles {
		if p.Name == "1g.5gb" {
			prof = p
		}
	}
	info, _ := dev.GetGpuInstanceProfileInfo(prof.GIProfileID)
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 4, Size: 1})
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	gii, _ := gi.GetInfo()
	m := New(srv, "node", Options{IgnoredXIDs: DefaultIgnoredXIDs})
	m.handle(ctx, nvml.EventData{Device: dev, EventType: nvml.EventTypeXidCriticalError, EventData: 94, GpuInstanceId: gii.Id, ComputeInstanceId: 0xFFFFFFFF})
	bad := m.Unhealthy(inv, names)
	if len(bad) != 1 {
		t.Fatalf("unhealthy %v", bad)
	}
	if _, ok := bad["gpu-0-mig-1g5gb-4"]; !ok {
		t.Errorf("unhealthy %v", bad)
	}
	// A GPU-wide XID covers every device of the GPU.
	m.handle(ctx, nvml.EventData{Device: dev, EventType: nvml.EventTypeXidCriticalError, EventData: 79, GpuInstanceId: 0xFFFFFFFF})
	if got := len(m.Unhealthy(inv, names)); got != len(names) {
		t.Errorf("%d of %d unhealthy", got, len(names))
	}
}
