package plugin

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-dev/tessera/deployments"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
	"github.com/tessera-dev/tessera/test/testutil"
)

// makeMIGByHand creates a MIG device (GPU and compute instance) in the mock
// GPUs' persisted state before the plugin starts, as `nvidia-smi mig -cgi
// <profile> -C` by an operator or an earlier driver would.
func makeMIGByHand(t *testing.T, opts *Options, profileID, start, size uint32) {
	t.Helper()
	spec, err := nvmlmock.ParseProfile(opts.Backend.MockProfile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(opts.PluginDataDir, 0o750); err != nil {
		t.Fatal(err)
	}
	srv, err := nvmlmock.New(nvmlmock.Options{Spec: spec, Seed: opts.NodeName, MIGEnabled: true, StatePath: filepath.Join(opts.PluginDataDir, "mock-gpu-state.json")})
	if err != nil {
		t.Fatal(err)
	}
	dev := srv.Devices()[0]
	info, ret := dev.GetGpuInstanceProfileInfo(int(profileID))
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: start, Size: size})
	if ret != nvml.SUCCESS {
		t.Fatalf("create GPU instance by hand: %v", ret)
	}
	ci, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := gi.CreateComputeInstance(&ci); ret != nvml.SUCCESS {
		t.Fatalf("create compute instance by hand: %v", ret)
	}
}

func (h *harness) publishedSlices() []*resourceapi.ResourceSlice {
	h.t.Helper()
	list, err := h.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	var out []*resourceapi.ResourceSlice
	for i := range list.Items {
		out = append(out, &list.Items[i])
	}
	return out
}

func (h *harness) publishedDevices() []string {
	var out []string
	for _, s := range h.publishedSlices() {
		for _, d := range s.Spec.Devices {
			out = append(out, d.Name)
		}
	}
	return out
}

// allocateMIG runs the real structured allocator over what the plugin
// published for one claim of a MIG profile; "" when it does not fit.
func (h *harness) allocateMIG(name, profile string) (*resourceapi.ResourceClaim, string) {
	h.t.Helper()
	classes, err := deployments.DeviceClasses()
	if err != nil {
		h.t.Fatal(err)
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: "alloc-uid-" + ktypes.UID(name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: "mig.tessera.dev", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
					Expression: `device.attributes["gpu.tessera.dev"].migProfile == "` + profile + `"`,
				}}},
			},
		}}}},
	}
	res, err := allocation.NewAllocator(h.publishedSlices(), classes).Allocate(context.Background(),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}}, allocation.NewState(), claim)
	if err != nil {
		h.t.Fatal(err)
	}
	if res == nil {
		return nil, ""
	}
	out := newClaim(name, res[0].Devices.Results...)
	return out, res[0].Devices.Results[0].Device
}

// TestForeignMIGInstanceStrandsNoPod: an A100 in MIG mode carries a
// 1g.5gb made by hand at placement 0 before the plugin starts. The
// published slices leave out every placement it blocks, so the real
// allocator cannot pick one; a 3g.20gb lands at 4 and prepares. With
// --mig-destroy-unknown the instance is destroyed at start and the whole
// GPU is offered again.
func TestForeignMIGInstanceStrandsNoPod(t *testing.T) {
	blocked := []string{"gpu-0-mig-1g5gb-0", "gpu-0-mig-1g5gb-me-0", "gpu-0-mig-1g10gb-0", "gpu-0-mig-2g10gb-0", "gpu-0-mig-3g20gb-0", "gpu-0-mig-4g20gb-0", "gpu-0-mig-7g40gb-0"}
	t.Run("left out of the slices", func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		dir := tempDir(t)
		opts := nodeOptions(dir, "a100-40gb", true, nil)
		makeMIGByHand(t, opts, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0, 1)
		h := startHarness(t, ctx, opts)
		testutil.EventuallyTrue(t, 10*time.Second, "published slices", func() bool { return len(h.publishedDevices()) > 0 })
		devices := h.publishedDevices()
		for _, b := range blocked {
			if slices.Contains(devices, b) {
				t.Errorf("published %s, which the hand-made 1g.5gb at 0 blocks", b)
			}
		}
		if !slices.Contains(devices, "gpu-0-mig-3g20gb-4") || !slices.Contains(devices, "gpu-0-mig-1g5gb-1") {
			t.Fatalf("free placements missing from %v", devices)
		}
		if c, dev := h.allocateMIG("big", "7g.40gb"); c != nil {
			t.Fatalf("7g.40gb was allocated on %s next to the hand-made instance", dev)
		}
		if c, dev := h.allocateMIG("four", "4g.20gb"); c != nil {
			t.Fatalf("4g.20gb was allocated on %s next to the hand-made instance", dev)
		}
		claim, dev := h.allocateMIG("three", "3g.20gb")
		if claim == nil || dev != "gpu-0-mig-3g20gb-4" {
			t.Fatalf("3g.20gb: allocated %q, want gpu-0-mig-3g20gb-4", dev)
		}
		h.addClaims(claim)
		resp, err := h.prepare(claim)
		if err != nil {
			t.Fatal(err)
		}
		if r := resp.Claims[string(claim.UID)]; r.Error != "" {
			t.Fatalf("prepare of the claim that landed elsewhere failed: %s", r.Error)
		}
		if n := mockMIGInstances(t, opts.PluginDataDir); n != 2 {
			t.Fatalf("%d GPU instances, want the hand-made one and the claim's", n)
		}
		// The claim's own instance is the plugin's: a republish keeps its
		// placement published (it is allocated, not blocked).
		if err := h.driver.publisher.Sync(h.ctx); err != nil {
			t.Fatal(err)
		}
		if devices := h.publishedDevices(); !slices.Contains(devices, "gpu-0-mig-3g20gb-4") || slices.Contains(devices, "gpu-0-mig-1g5gb-0") {
			t.Fatalf("after republishing: %v", devices)
		}
	})
	t.Run("destroyed with --mig-destroy-unknown", func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		dir := tempDir(t)
		opts := nodeOptions(dir, "a100-40gb", true, nil)
		opts.MIGDestroyUnknown = true
		makeMIGByHand(t, opts, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0, 1)
		h := startHarness(t, ctx, opts)
		if n := mockMIGInstances(t, opts.PluginDataDir); n != 0 {
			t.Fatalf("%d GPU instances left after start, want the hand-made one destroyed", n)
		}
		testutil.EventuallyTrue(t, 10*time.Second, "published slices", func() bool { return len(h.publishedDevices()) > 0 })
		devices := h.publishedDevices()
		for _, b := range blocked {
			if !slices.Contains(devices, b) {
				t.Errorf("%s not published after the hand-made instance was destroyed", b)
			}
		}
		claim, dev := h.allocateMIG("big", "7g.40gb")
		if claim == nil {
			t.Fatal("7g.40gb does not fit after the hand-made instance was destroyed")
		}
		h.addClaims(claim)
		resp, err := h.prepare(claim)
		if err != nil {
			t.Fatal(err)
		}
		if r := resp.Claims[string(claim.UID)]; r.Error != "" {
			t.Fatalf("prepare of %s failed: %s", dev, r.Error)
		}
	})
}
