package prepare

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/discover"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
	"github.com/tessera-dev/tessera/pkg/node/cdispec"
	"github.com/tessera-dev/tessera/pkg/node/checkpoint"
	"github.com/tessera-dev/tessera/pkg/node/driverfiles"
	"github.com/tessera-dev/tessera/pkg/node/enforce"
	"github.com/tessera-dev/tessera/pkg/node/interposercache"
	"github.com/tessera-dev/tessera/pkg/node/mig"
	"github.com/tessera-dev/tessera/pkg/node/mps"
	"github.com/tessera-dev/tessera/pkg/node/timeslice"
)

const (
	driver = devicemodel.DriverName
	node   = "node-1"
	gib    = int64(1) << 30
)

// env is a node with mock GPUs and a Preparer over temp directories.
type env struct {
	t       *testing.T
	ctx     context.Context
	dir     string
	srv     *nvmlmock.Server
	inv     *inventory.Inventory
	cfg     devicemodel.Config
	opts    Options
	p       *Preparer
	status  *fakeStatus
	bootID  string
	profile string
	mig     bool
	shared  bool
	// apiClaims are the claims the API server holds; apiDown makes it
	// refuse every request; gets are the claims read, as namespace/name.
	apiClaims []resourceapi.ResourceClaim
	apiDown   bool
	gets      []string
	// lastMounts are the mounts of the last inject.
	lastMounts []oci.Mount
	// driverRoot, when set, is a fixture driver root whose files every
	// claim gets.
	driverRoot string
}

type envOption func(*env)

func withMIG() envOption { return func(e *env) { e.mig = true; e.profile = "a100-40gb" } }
func withTimeSlices(n int) envOption {
	return func(e *env) { e.cfg.TimeSlices = n }
}
func withSharedLock() envOption { return func(e *env) { e.shared = true } }
func withMPSPerClaim() envOption {
	return func(e *env) {
		e.opts.MPS = &mps.Manager{Root: filepath.Join(e.dir, "mps"), Control: mps.Fake{}}
		e.opts.Enforce.MPSPerClaim = true
	}
}
func withDriverRoot(root string) envOption { return func(e *env) { e.driverRoot = root } }
func withInterposer(lib string) envOption {
	return func(e *env) { e.opts.Enforce.InterposerLibrary = lib }
}

func newEnv(t *testing.T, opts ...envOption) *env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	e := &env{t: t, ctx: ctx, dir: t.TempDir(), profile: "t4:2", bootID: "boot-1",
		cfg: devicemodel.Config{ReservedMemory: devicemodel.DefaultReservedMemory, MIGMode: devicemodel.MIGDynamic}}
	for _, o := range opts {
		o(e)
	}
	// Claims left prepared (crash tests) leave their accounting tmpfs
	// mounted; unmount them before the temp directory is removed.
	t.Cleanup(func() {
		entries, _ := os.ReadDir(filepath.Join(e.dir, "accounting"))
		for _, en := range entries {
			_ = interposercache.RemoveDir(ctx, filepath.Join(e.dir, "accounting", en.Name()))
		}
	})
	e.start()
	return e
}

// start (re)creates the mock GPUs and the Preparer, as a plugin start does.
func (e *env) start() {
	t := e.t
	spec, err := nvmlmock.ParseProfile(e.profile)
	if err != nil {
		t.Fatal(err)
	}
	e.srv, err = nvmlmock.New(nvmlmock.Options{Spec: spec, Seed: node, MIGEnabled: e.mig, StatePath: filepath.Join(e.dir, "mock-gpu-state.json")})
	if err != nil {
		t.Fatal(err)
	}
	e.inv, err = discover.Discover(e.ctx, e.srv)
	if err != nil {
		t.Fatal(err)
	}
	store, err := checkpoint.Open(filepath.Join(e.dir, "checkpoint"), e.bootID)
	if err != nil {
		t.Fatal(err)
	}
	e.status = &fakeStatus{set: map[types.UID][]resourceapi.AllocatedDeviceStatus{}}
	enf, mpsManager := e.opts.Enforce, e.opts.MPS
	e.opts = Options{
		DriverName: driver, NodeName: node, Checkpoints: store,
		CDI:       cdispec.Dir{Path: filepath.Join(e.dir, "cdi")},
		Nodes:     cdispec.NewMockNodes(filepath.Join(e.dir, "dev")),
		MIG:       mig.New(e.srv),
		MIGMode:   e.cfg.MIGMode,
		TimeSlice: timeslice.NewManager(&timeslice.FileRecorder{Path: filepath.Join(e.dir, "mock-timeslice.json")}),
		Enforce:   enf, AccountingDir: filepath.Join(e.dir, "accounting"),
		Model:    func() (*inventory.Inventory, devicemodel.Config) { return e.inv, e.cfg },
		Status:   e.status,
		GetClaim: e.getClaim,
		MPS:      mpsManager,
	}
	if e.shared {
		e.opts.SharedLock = filepath.Join(e.dir, "serialize.lock")
	}
	if e.driverRoot != "" {
		df, err := driverfiles.New(driverfiles.Options{DriverRoot: e.driverRoot, HookPath: "/opt/tessera/bin/nvidia-cdi-hook", NVML: e.srv})
		if err != nil {
			t.Fatal(err)
		}
		e.opts.DriverFiles = df
	}
	e.p = New(e.opts)
	if err := e.p.Recover(e.ctx); err != nil {
		t.Fatal(err)
	}
}

func (e *env) getClaim(_ context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	e.gets = append(e.gets, namespace+"/"+name)
	if e.apiDown {
		return nil, errors.New("connection refused")
	}
	for i := range e.apiClaims {
		if c := &e.apiClaims[i]; c.Namespace == namespace && c.Name == name {
			return c.DeepCopy(), nil
		}
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("resourceclaims"), name)
}

func (e *env) prepare(c *resourceapi.ResourceClaim) []string {
	e.t.Helper()
	devs, err := e.p.Prepare(e.ctx, c)
	if err != nil {
		e.t.Fatalf("prepare %s: %v", c.Name, err)
	}
	var ids []string
	for _, d := range devs {
		ids = append(ids, d.CDIDeviceIDs...)
	}
	return ids
}

func (e *env) unprepare(c *resourceapi.ResourceClaim) {
	e.t.Helper()
	if err := e.p.Unprepare(e.ctx, types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, c.UID); err != nil {
		e.t.Fatalf("unprepare %s: %v", c.Name, err)
	}
}

// inject has the CDI library a runtime uses inject devices and returns
// the container's environment and device paths.
func (e *env) inject(ids ...string) (map[string]string, []string) {
	e.t.Helper()
	spec := e.injectSpec(ids...)
	env := map[string]string{}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	var paths []string
	for _, d := range spec.Linux.Devices {
		paths = append(paths, d.Path)
	}
	return env, paths
}

// injectSpec returns the OCI spec of a container given the CDI devices.
func (e *env) injectSpec(ids ...string) *oci.Spec {
	e.t.Helper()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(e.opts.CDI.Path), cdi.WithAutoRefresh(false))
	if err != nil {
		e.t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		e.t.Fatalf("CDI errors: %v", errs)
	}
	spec := &oci.Spec{Process: &oci.Process{Env: []string{"PATH=/bin"}}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(spec, ids...); err != nil {
		e.t.Fatal(err)
	}
	e.lastMounts = spec.Mounts
	return spec
}

// migInstances lists the GPU instances in the mock's persisted state.
func (e *env) migInstances() int {
	e.t.Helper()
	data, err := os.ReadFile(filepath.Join(e.dir, "mock-gpu-state.json"))
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		e.t.Fatal(err)
	}
	var st struct {
		GPUs map[string]struct {
			GIs []json.RawMessage `json:"gpuInstances"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		e.t.Fatal(err)
	}
	n := 0
	for _, g := range st.GPUs {
		n += len(g.GIs)
	}
	return n
}

func (e *env) files(sub string) []string {
	entries, _ := os.ReadDir(filepath.Join(e.dir, sub))
	var out []string
	for _, en := range entries {
		out = append(out, en.Name())
	}
	return out
}

// assertClean checks that nothing of any claim is left.
func (e *env) assertClean() {
	e.t.Helper()
	for _, sub := range []string{"cdi", "checkpoint", "accounting", "mps", "claims"} {
		if f := e.files(sub); len(f) > 0 {
			e.t.Errorf("%s left: %v", sub, f)
		}
	}
	if n := e.migInstances(); n > 0 {
		e.t.Errorf("%d MIG instances left", n)
	}
	if p := e.p.Prepared(); len(p) > 0 {
		e.t.Errorf("claims still recorded: %v", p)
	}
}

type fakeStatus struct {
	mu      sync.Mutex
	set     map[types.UID][]resourceapi.AllocatedDeviceStatus
	cleared []types.UID
}

func (f *fakeStatus) Set(_ context.Context, _ types.NamespacedName, uid types.UID, d []resourceapi.AllocatedDeviceStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.set[uid] = d
}

func (f *fakeStatus) Clear(_ context.Context, _ types.NamespacedName, uid types.UID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.set, uid)
	f.cleared = append(f.cleared, uid)
}

// claim builds an allocated, reserved claim.
func claim(name string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Status: resourceapi.ResourceClaimStatus{
			Allocation:  &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p-" + name, UID: types.UID("pod-" + name)}},
		},
	}
}

func share(request, device, shareID string, memory int64, cores int64) resourceapi.DeviceRequestAllocationResult {
	r := resourceapi.DeviceRequestAllocationResult{Request: request, Driver: driver, Pool: node, Device: device}
	if shareID != "" {
		s := types.UID(shareID)
		r.ShareID = &s
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
			devicemodel.CapMemory: *resource.NewQuantity(memory, resource.BinarySI),
			devicemodel.CapCores:  *resource.NewQuantity(cores, resource.DecimalSI),
		}
	}
	return r
}

func device(request, name string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: request, Driver: driver, Pool: node, Device: name}
}

// withConfig adds an opaque GpuConfig to the claim's allocation.
func withConfig(c *resourceapi.ResourceClaim, source resourceapi.AllocationConfigSource, requests []string, params string) *resourceapi.ResourceClaim {
	c.Status.Allocation.Devices.Config = append(c.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
		Source:   source,
		Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver:     driver,
			Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig",` + params + `}`)},
		}},
	})
	return c
}

func contains(t *testing.T, list []string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(list, w) {
			t.Errorf("%v lacks %s", list, w)
		}
	}
}

var _ = enforce.Hard
