package plugin

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"
	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
	"github.com/tessera-dev/tessera/pkg/node/cdispec"
	"github.com/tessera-dev/tessera/pkg/node/health"
	"github.com/tessera-dev/tessera/pkg/node/prepare"
	"github.com/tessera-dev/tessera/test/testutil"
)

// TestKubeletGRPC speaks the kubelet's DRA gRPC API to the plugin's Unix
// socket: a share, a whole GPU, a time slice and a MIG partition prepare
// into CDI specs, a claim with bad configuration fails alone, status.devices
// is written, and unprepare leaves nothing behind.
func TestKubeletGRPC(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := tempDir(t)
	opts := nodeOptions(dir, "t4:3,a100-40gb", true, map[string]int{"2": 4})
	claims := []*resourceapi.ResourceClaim{
		withGpuConfig(newClaim("share", shareResult("gpu", "gpu-0", "share-1", 2*gib, 30)), nil, `"enforcement":"interposer"`),
		newClaim("whole", deviceResult("gpu", "gpu-1")),
		withGpuConfig(newClaim("slice", deviceResult("ts", "gpu-2-ts-3")), nil, `"timeSliceInterval":"Medium"`),
		newClaim("mig", deviceResult("mig", "gpu-3-mig-3g20gb-4")),
	}
	bad := withGpuConfig(newClaim("bad", shareResult("gpu", "gpu-0", "share-2", gib, 0)), []string{"gpu"}, `"enforcement":"hard"`)
	h := startHarness(t, ctx, opts, append(claims, bad)...)

	resp, err := h.prepare(append(claims, bad)...)
	if err != nil {
		t.Fatal(err)
	}
	if e := resp.Claims[string(bad.UID)].GetError(); !strings.Contains(e, "enforcement") || !strings.Contains(e, `"mps"`) {
		t.Errorf("bad claim: %q", e)
	}
	cdi := cdispec.Dir{Path: opts.CDIRoot}
	for _, c := range claims {
		r := resp.Claims[string(c.UID)]
		if r.GetError() != "" {
			t.Fatalf("%s: %s", c.Name, r.GetError())
		}
		res := c.Status.Allocation.Devices.Results[0]
		if len(r.Devices) != 1 || r.Devices[0].DeviceName != res.Device || r.Devices[0].PoolName != testNode || len(r.Devices[0].CdiDeviceIds) != 1 {
			t.Fatalf("%s: devices %v", c.Name, r.Devices)
		}
		if res.ShareID != nil && r.Devices[0].GetShareId() != string(*res.ShareID) {
			t.Errorf("%s: share ID %q", c.Name, r.Devices[0].GetShareId())
		}
		spec, err := cdi.Read(cdispec.SpecName(string(c.UID)))
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		id := r.Devices[0].CdiDeviceIds[0]
		if !strings.HasSuffix(id, "="+spec.Devices[0].Name) {
			t.Errorf("%s: CDI ID %s not in spec", c.Name, id)
		}
		t.Logf("%s: %v", c.Name, spec.ContainerEdits.Env)
	}
	envOf := func(c *resourceapi.ResourceClaim) string {
		spec, _ := cdi.Read(cdispec.SpecName(string(c.UID)))
		return strings.Join(spec.ContainerEdits.Env, " ")
	}
	for c, want := range map[*resourceapi.ResourceClaim][]string{
		claims[0]: {"CUDA_DEVICE_MEMORY_LIMIT_0=2048m", "CUDA_DEVICE_SM_LIMIT_0=30", "TESSERA_MODE=interposer"},
		claims[1]: {"TESSERA_MODE=exclusive", "TESSERA_ENFORCED=hard"},
		claims[2]: {"TESSERA_DEVICE=gpu-2-ts-3", "TESSERA_MODE=none"},
		claims[3]: {"NVIDIA_VISIBLE_DEVICES=MIG-", "TESSERA_MODE=mig"},
	} {
		for _, w := range want {
			if !strings.Contains(envOf(c), w) {
				t.Errorf("%s: env lacks %s: %s", c.Name, w, envOf(c))
			}
		}
	}

	// status.devices is written in the background.
	testutil.EventuallyTrue(t, 10*time.Second, "status.devices", func() bool {
		for _, c := range claims {
			got, err := h.client.ResourceV1().ResourceClaims(c.Namespace).Get(context.Background(), c.Name, metav1.GetOptions{})
			if err != nil || len(got.Status.Devices) != 1 {
				return false
			}
			var data prepare.StatusData
			if err := json.Unmarshal(got.Status.Devices[0].Data.Raw, &data); err != nil || data.UUID == "" || data.Enforcement == "" {
				return false
			}
		}
		return true
	})

	// The kubelet retries: the same answer.
	again, err := h.prepare(claims...)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claims {
		if again.Claims[string(c.UID)].Devices[0].CdiDeviceIds[0] != resp.Claims[string(c.UID)].Devices[0].CdiDeviceIds[0] {
			t.Errorf("%s: devices changed on retry", c.Name)
		}
	}

	un, err := h.unprepare(append(claims, bad, newClaim("never-prepared"))...)
	if err != nil {
		t.Fatal(err)
	}
	for uid, r := range un.Claims {
		if r.GetError() != "" {
			t.Errorf("unprepare %s: %s", uid, r.GetError())
		}
	}
	for _, d := range []string{opts.CDIRoot, filepath.Join(opts.PluginDataDir, checkpointDir), filepath.Join(opts.PluginDataDir, accountingDir)} {
		if left := dirEntries(d); len(left) > 0 {
			t.Errorf("%s left: %v", d, left)
		}
	}
	if n := mockMIGInstances(t, opts.PluginDataDir); n != 0 {
		t.Errorf("%d MIG instances left", n)
	}
	testutil.EventuallyTrue(t, 10*time.Second, "status.devices cleared", func() bool {
		for _, c := range claims {
			got, err := h.client.ResourceV1().ResourceClaims(c.Namespace).Get(context.Background(), c.Name, metav1.GetOptions{})
			if err != nil || len(got.Status.Devices) != 0 {
				return false
			}
		}
		return true
	})
}

// mockMIGInstances counts the GPU instances in the mock's state file.
func mockMIGInstances(t testing.TB, stateDir string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(stateDir, "mock-gpu-state.json"))
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		GPUs map[string]struct {
			GIs []json.RawMessage `json:"gpuInstances"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatalf("mock state: %v", err)
	}
	n := 0
	for _, g := range st.GPUs {
		n += len(g.GIs)
	}
	return n
}

// TestHealthOverGRPCAndTaints injects an XID through the mock's fault
// file and expects the kubelet's health stream to report the GPU's devices
// unhealthy and the republished slices to taint them.
func TestHealthOverGRPCAndTaints(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := tempDir(t)
	opts := nodeOptions(dir, "t4:2", false, map[string]int{"1": 2})
	opts.HealthHoldDown = time.Second
	h := startHarness(t, ctx, opts)
	stream, err := drahealth.NewDRAResourceHealthClient(h.conn).NodeWatchResources(h.ctx, &drahealth.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Devices) != 4 {
		t.Fatalf("first report: %v", first.Devices)
	}
	for _, d := range first.Devices {
		if d.Health != drahealth.HealthStatus_HEALTHY {
			t.Errorf("%s: %v", d.Device.DeviceName, d.Health)
		}
	}
	if err := os.WriteFile(filepath.Join(opts.PluginDataDir, nvmlmock.InjectFileName), []byte("1 79\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for {
		r, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		unhealthy := map[string]bool{}
		for _, d := range r.Devices {
			if d.Health == drahealth.HealthStatus_UNHEALTHY {
				unhealthy[d.Device.DeviceName] = true
			}
		}
		if len(unhealthy) == 0 {
			continue
		}
		if len(unhealthy) != 3 || !unhealthy["gpu-1"] || !unhealthy["gpu-1-ts-0"] || !unhealthy["gpu-1-ts-1"] {
			t.Fatalf("unhealthy %v", unhealthy)
		}
		break
	}
	tainted := func() (int, int) {
		slices, err := h.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return -1, -1
		}
		lost, any := 0, 0
		for _, s := range slices.Items {
			for _, d := range s.Spec.Devices {
				any += len(d.Taints)
				for _, taint := range d.Taints {
					if taint.Key == health.KeyGPULost && taint.Value == "xid-79" && taint.TimeAdded != nil &&
						taint.Effect == resourceapi.DeviceTaintEffectNoSchedule && strings.HasPrefix(d.Name, "gpu-1") {
						lost++
					}
				}
			}
		}
		return lost, any
	}
	testutil.EventuallyTrue(t, 10*time.Second, "tainted slices", func() bool {
		lost, any := tainted()
		if lost != 3 || any != 3 {
			t.Logf("%d devices tainted gpu-lost, %d taints", lost, any)
		}
		return lost == 3 && any == 3
	})
	// The GPU comes back (a reset): after the hold-down the taints go.
	if err := os.WriteFile(filepath.Join(opts.PluginDataDir, nvmlmock.InjectFileName), []byte("1 recover\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyTrue(t, 20*time.Second, "untainted slices", func() bool {
		_, any := tainted()
		return any == 0
	})
}

// TestParallelPrepareOverGRPC prepares hundreds of claims with concurrent
// kubelet calls (run with -race).
func TestParallelPrepareOverGRPC(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := tempDir(t)
	opts := nodeOptions(dir, "t4:4", false, nil)
	const n = 200
	var claims []*resourceapi.ResourceClaim
	for i := range n {
		claims = append(claims, newClaim("c"+strconv.Itoa(i), shareResult("gpu", "gpu-"+strconv.Itoa(i%4), "s"+strconv.Itoa(i), 256<<20, int64(i%3))))
	}
	h := startHarness(t, ctx, opts, claims...)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i += 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			batch := claims[i:min(i+4, n)]
			resp, err := h.prepare(batch...)
			if err != nil {
				errs <- err
				return
			}
			for _, c := range batch {
				if e := resp.Claims[string(c.UID)].GetError(); e != "" {
					errs <- &prepareErr{c.Name, e}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := len(dirEntries(opts.CDIRoot)); got != n {
		t.Errorf("%d specs for %d claims", got, n)
	}
	var unwg sync.WaitGroup
	for _, c := range claims {
		unwg.Add(1)
		go func() {
			defer unwg.Done()
			resp, err := h.unprepare(c)
			if err != nil || resp.Claims[string(c.UID)].GetError() != "" {
				t.Errorf("unprepare %s: %v %v", c.Name, err, resp)
			}
		}()
	}
	unwg.Wait()
	if left := dirEntries(opts.CDIRoot); len(left) != 0 {
		t.Errorf("specs left: %d", len(left))
	}
}

type prepareErr struct{ claim, msg string }

func (e *prepareErr) Error() string { return e.claim + ": " + e.msg }
