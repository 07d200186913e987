package prepare

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/node/cdispec"
	"github.com/tessera-dev/tessera/pkg/node/enforce"
	"github.com/tessera-dev/tessera/pkg/node/interposercache"
	"github.com/tessera-dev/tessera/pkg/node/mig"
	"github.com/tessera-dev/tessera/pkg/node/mps"
	"github.com/tessera-dev/tessera/pkg/node/timeslice"
)

const t4Usable = (15360 - 256) << 20

// TestClaimKinds prepares a claim of every kind into a valid CDI spec with
// the right environment and unprepares it without a trace.
func TestClaimKinds(t *testing.T) {
	lib := filepath.Join(t.TempDir(), "libvgpu.so")
	tests := []struct {
		name    string
		opts    []envOption
		claim   *resourceapi.ResourceClaim
		env     map[string]string
		devices []string
		absent  []string
	}{
		{
			name:  "memory share with interposer",
			opts:  []envOption{withInterposer(lib)},
			claim: claim("share", share("gpu", "gpu-0", "s-1", 4*gib, 25)),
			env: map[string]string{
				"CUDA_DEVICE_MEMORY_LIMIT_0": "4096m", "CUDA_DEVICE_SM_LIMIT_0": "25",
				"LD_PRELOAD": "/usr/local/tessera/lib/libvgpu.so", "TESSERA_MODE": "interposer", "TESSERA_ENFORCED": "interposer",
				"TESSERA_MEMORY_LIMIT": "4294967296", "TESSERA_DEVICE": "gpu-0", "TESSERA_CLAIM": "ns/share",
			},
			devices: []string{"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"},
		},
		{
			name:    "whole GPU",
			claim:   claim("whole", share("gpu", "gpu-1", "s-2", t4Usable, 0)),
			env:     map[string]string{"TESSERA_MODE": "exclusive", "TESSERA_ENFORCED": "hard", "TESSERA_MEMORY_LIMIT": strconv.Itoa(t4Usable), "TESSERA_DEVICE": "gpu-1"},
			devices: []string{"/dev/nvidia1"},
			absent:  []string{"CUDA_DEVICE_MEMORY_LIMIT_0", "LD_PRELOAD"},
		},
		{
			name:    "whole GPU without shares",
			claim:   claim("exclusive", device("gpu", "gpu-0")),
			env:     map[string]string{"TESSERA_MODE": "exclusive", "TESSERA_MEMORY_LIMIT": strconv.Itoa(t4Usable)},
			devices: []string{"/dev/nvidia0"},
		},
		{
			name: "time slice",
			opts: []envOption{withTimeSlices(4), withInterposer(lib)},
			claim: withConfig(claim("ts", device("ts", "gpu-1-ts-2")), resourceapi.AllocationConfigSourceClaim, nil,
				`"enforcement":"interposer","timeSliceInterval":"Short","frameworkCaps":["pytorch"]`),
			env: map[string]string{
				"CUDA_DEVICE_MEMORY_LIMIT_0": strconv.Itoa(t4Usable/4>>20) + "m", "TESSERA_DEVICE": "gpu-1-ts-2", "TESSERA_MODE": "interposer",
				"PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:1.000",
				// A time slice has no compute cap; the pod cannot supply one.
				"CUDA_DEVICE_SM_LIMIT_0": "100", "GPU_CORE_UTILIZATION_POLICY": "force",
			},
			devices: []string{"/dev/nvidia1"},
		},
		{
			name:    "MIG partition",
			opts:    []envOption{withMIG()},
			claim:   claim("mig", device("mig", "gpu-0-mig-1g5gb-3")),
			env:     map[string]string{"TESSERA_MODE": "mig", "TESSERA_ENFORCED": "hard", "TESSERA_DEVICE": "gpu-0-mig-1g5gb-3"},
			devices: []string{"/dev/nvidia0", "/dev/nvidiactl"},
			absent:  []string{"CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.opts...)
			ids := e.prepare(tt.claim)
			if len(ids) != len(tt.claim.Status.Allocation.Devices.Results) {
				t.Fatalf("CDI devices %v", ids)
			}
			r := tt.claim.Status.Allocation.Devices.Results[0]
			want := cdispec.QualifiedName(cdispec.DeviceName(string(tt.claim.UID), r.Device, shareOf(r)))
			if ids[0] != want {
				t.Errorf("CDI device %s, want %s", ids[0], want)
			}
			env, devices := e.inject(ids...)
			for k, v := range tt.env {
				if env[k] != v {
					t.Errorf("%s=%q, want %q", k, env[k], v)
				}
			}
			for _, k := range tt.absent {
				if _, ok := env[k]; ok {
					t.Errorf("%s set: %s", k, env[k])
				}
			}
			contains(t, devices, tt.devices...)
			uuid := env["NVIDIA_VISIBLE_DEVICES"]
			if uuid == "" || env["CUDA_VISIBLE_DEVICES"] != uuid || env["TESSERA_UUID"] != uuid {
				t.Errorf("visible devices %q / %q", uuid, env["CUDA_VISIBLE_DEVICES"])
			}
			if e.mig {
				if !strings.HasPrefix(uuid, "MIG-") || e.migInstances() != 1 {
					t.Errorf("MIG UUID %s, %d instances", uuid, e.migInstances())
				}
				if len(devices) != 6 {
					t.Errorf("MIG capability nodes missing: %v", devices)
				}
			} else if uuid != e.inv.GPUs[mustIndex(r.Device)].UUID {
				t.Errorf("UUID %s is not GPU %s's", uuid, r.Device)
			}
			st := e.status.set[tt.claim.UID]
			if len(st) != 1 || st[0].Device != r.Device || st[0].Pool != node {
				t.Fatalf("status %+v", st)
			}
			var data StatusData
			if err := json.Unmarshal(st[0].Data.Raw, &data); err != nil {
				t.Fatal(err)
			}
			if data.UUID != uuid || data.Enforcement != env["TESSERA_MODE"] || strconv.FormatUint(data.MemoryLimitBytes, 10) != env["TESSERA_MEMORY_LIMIT"] {
				t.Errorf("status data %+v", data)
			}
			if e.mig && data.MIGProfile != "1g.5gb" {
				t.Errorf("MIG profile %q", data.MIGProfile)
			}

			// Prepare again (the kubelet retries): same devices, same spec.
			specBefore, _ := os.ReadFile(filepath.Join(e.opts.CDI.Path, cdispec.SpecName(string(tt.claim.UID))))
			if again := e.prepare(tt.claim); !slices.Equal(again, ids) {
				t.Errorf("second prepare %v, first %v", again, ids)
			}
			specAfter, _ := os.ReadFile(filepath.Join(e.opts.CDI.Path, cdispec.SpecName(string(tt.claim.UID))))
			if string(specBefore) != string(specAfter) {
				t.Error("spec changed on the second prepare")
			}
			if e.mig && e.migInstances() != 1 {
				t.Error("second prepare created another MIG instance")
			}
			e.unprepare(tt.claim)
			e.unprepare(tt.claim)
			e.assertClean()
			if len(e.status.set) != 0 {
				t.Errorf("status not cleared: %v", e.status.set)
			}
		})
	}
}

func shareOf(r resourceapi.DeviceRequestAllocationResult) string {
	if r.ShareID == nil {
		return ""
	}
	return string(*r.ShareID)
}

func mustIndex(device string) int {
	i, _ := strconv.Atoi(strings.TrimPrefix(strings.Split(device, "-ts-")[0], "gpu-"))
	return i
}

func TestUnprepareUnknownClaim(t *testing.T) {
	e := newEnv(t)
	if err := e.p.Unprepare(e.ctx, types.NamespacedName{Namespace: "ns", Name: "never"}, "uid-never"); err != nil {
		t.Fatal(err)
	}
	e.assertClean()
}

func TestBadConfigFailsOnlyItsClaim(t *testing.T) {
	e := newEnv(t, withTimeSlices(2))
	good := claim("good", share("gpu", "gpu-0", "s-1", gib, 0))
	tests := []struct {
		params string
		want   []string
	}{
		{`"enforcement":"magic"`, []string{"enforcement", `"magic"`, `"auto"`, `"interposer"`, `"mps"`, `"none"`}},
		{`"timeSliceInterval":"Forever"`, []string{"timeSliceInterval", `"Default"`, `"Short"`, `"Medium"`, `"Long"`}},
		{`"frameworkCaps":["tensorflow"]`, []string{"frameworkCaps[0]", `"pytorch"`, `"xla"`}},
		{`"enforcment":"mps"`, []string{`unknown field "enforcment"`, "enforcement"}},
	}
	for i, tt := range tests {
		bad := withConfig(claim("bad"+strconv.Itoa(i), share("gpu", "gpu-1", "s-"+strconv.Itoa(i), gib, 0)), resourceapi.AllocationConfigSourceClass, []string{"gpu"}, tt.params)
		_, err := e.p.Prepare(e.ctx, bad)
		if err == nil {
			t.Fatalf("%s: prepared", tt.params)
		}
		for _, w := range append(tt.want, "DeviceClass configuration", "request gpu") {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q lacks %q", tt.params, err, w)
			}
		}
	}
	e.prepare(good)
	if len(e.files("cdi")) != 1 {
		t.Errorf("specs %v", e.files("cdi"))
	}
	e.unprepare(good)
	e.assertClean()
}

func TestConfigPrecedence(t *testing.T) {
	c := claim("c", share("a", "gpu-0", "s-1", gib, 0), share("b", "gpu-1", "s-2", gib, 0))
	withConfig(c, resourceapi.AllocationConfigSourceClass, []string{"a", "b"}, `"enforcement":"mps","frameworkCaps":["xla"]`)
	withConfig(c, resourceapi.AllocationConfigSourceClaim, []string{"b"}, `"enforcement":"none"`)
	withConfig(c, resourceapi.AllocationConfigSourceClaim, nil, `"enforcement":"interposer","timeSliceInterval":"Long"`)
	results := c.Status.Allocation.Devices.Results
	a, err := ConfigFor(c, driver, results[0])
	if err != nil {
		t.Fatal(err)
	}
	if a.Enforcement != v1alpha1.EnforcementInterposer || a.TimeSliceInterval != v1alpha1.TimeSliceLong || !a.HasFrameworkCap(v1alpha1.FrameworkCapXLA) {
		t.Errorf("request a: %+v", a)
	}
	b, err := ConfigFor(c, driver, results[1])
	if err != nil {
		t.Fatal(err)
	}
	if b.Enforcement != v1alpha1.EnforcementNone || b.TimeSliceInterval != v1alpha1.TimeSliceLong {
		t.Errorf("request b: %+v", b)
	}
	// Configuration of other drivers is ignored; subrequests match their request.
	other := claim("o", share("a/big", "gpu-0", "s-1", gib, 0))
	withConfig(other, resourceapi.AllocationConfigSourceClaim, []string{"a"}, `"enforcement":"mps"`)
	other.Status.Allocation.Devices.Config = append(other.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
		Source:              resourceapi.AllocationConfigSourceClaim,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "gpu.nvidia.com"}},
	})
	got, err := ConfigFor(other, driver, other.Status.Allocation.Devices.Results[0])
	if err != nil || got.Enforcement != v1alpha1.EnforcementMPS {
		t.Errorf("subrequest: %+v %v", got, err)
	}
	none, _ := ConfigFor(claim("n", share("a", "gpu-0", "s", gib, 0)), driver, share("a", "gpu-0", "s", gib, 0))
	if none.Enforcement != v1alpha1.EnforcementAuto || none.TimeSliceInterval != "" || len(none.FrameworkCaps) != 0 {
		t.Errorf("defaults: %+v", none)
	}
}

func TestTimeSliceConflict(t *testing.T) {
	e := newEnv(t, withTimeSlices(4))
	a := withConfig(claim("a", device("ts", "gpu-0-ts-0")), resourceapi.AllocationConfigSourceClaim, nil, `"timeSliceInterval":"Short"`)
	b := withConfig(claim("b", device("ts", "gpu-0-ts-1")), resourceapi.AllocationConfigSourceClaim, nil, `"timeSliceInterval":"Long"`)
	c := claim("c", device("ts", "gpu-0-ts-2"))
	d := withConfig(claim("d", device("ts", "gpu-1-ts-0")), resourceapi.AllocationConfigSourceClaim, nil, `"timeSliceInterval":"Long"`)
	e.prepare(a)
	st, _ := timeslice.ReadRecorded(filepath.Join(e.dir, "mock-timeslice.json"))
	if st[e.inv.GPUs[0].UUID] != v1alpha1.TimeSliceShort {
		t.Errorf("interval not set: %v", st)
	}
	_, err := e.p.Prepare(e.ctx, b)
	var conflict *timeslice.Conflict
	if !errors.As(err, &conflict) || !strings.Contains(err.Error(), "ns/a") || !strings.Contains(err.Error(), "Long") || !strings.Contains(err.Error(), "Short") {
		t.Fatalf("want a conflict naming ns/a, Short and Long: %v", err)
	}
	e.prepare(c) // no interval asked: no conflict
	e.prepare(d) // another GPU
	e.unprepare(a)
	st, _ = timeslice.ReadRecorded(filepath.Join(e.dir, "mock-timeslice.json"))
	if st[e.inv.GPUs[0].UUID] != v1alpha1.TimeSliceDefault {
		t.Errorf("interval not reset: %v", st)
	}
	e.prepare(b) // now it can
	for _, x := range []*resourceapi.ResourceClaim{b, c, d} {
		e.unprepare(x)
	}
	e.assertClean()
}

func TestDeviceNeverHandedToTwoClaims(t *testing.T) {
	e := newEnv(t, withTimeSlices(2))
	e.prepare(claim("a", share("gpu", "gpu-0", "s-1", 10*gib, 0)))
	for _, tt := range []struct {
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{claim("b", share("gpu", "gpu-0", "s-2", 10*gib, 0)), "oversubscribed"},
		{claim("c", share("gpu", "gpu-0", "s-1", gib, 0)), "share s-1 is already prepared"},
		{claim("d", device("ts", "gpu-0-ts-1")), "carries a share"},
		{claim("e", device("gpu", "gpu-0")), "oversubscribed"},
		{claim("f", share("gpu", "gpu-7", "s-3", gib, 0)), "does not publish device gpu-7"},
		{func() *resourceapi.ResourceClaim {
			c := claim("g", share("gpu", "gpu-1", "s-4", gib, 0))
			c.Status.Allocation.Devices.Results[0].Pool = "other-node"
			return c
		}(), "not this node's pool"},
	} {
		if _, err := e.p.Prepare(e.ctx, tt.claim); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want %q", tt.claim.Name, err, tt.want)
		}
	}
	e.prepare(claim("h", share("gpu", "gpu-0", "s-5", 4*gib, 0)))
	e.prepare(claim("i", device("ts", "gpu-1-ts-0")))
	if _, err := e.p.Prepare(e.ctx, claim("j", device("ts", "gpu-1-ts-0"))); err == nil || !strings.Contains(err.Error(), "already prepared for claim ns/i") {
		t.Errorf("time slice twice: %v", err)
	}
}

func TestReallocatedClaimIsRedone(t *testing.T) {
	e := newEnv(t)
	c := claim("c", share("gpu", "gpu-0", "s-1", gib, 0))
	first := e.prepare(c)
	c2 := claim("c", share("gpu", "gpu-1", "s-9", 2*gib, 0))
	second := e.prepare(c2)
	if slices.Equal(first, second) {
		t.Fatal("same devices after reallocation")
	}
	env, devices := e.inject(second...)
	if env["TESSERA_DEVICE"] != "gpu-1" || !slices.Contains(devices, "/dev/nvidia1") {
		t.Errorf("env %v devices %v", env, devices)
	}
	e.unprepare(c2)
	e.assertClean()
}

// TestManyClaimsInParallel prepares and unprepares hundreds of claims at
// once (run it with -race).
func TestManyClaimsInParallel(t *testing.T) {
	e := newEnv(t, withTimeSlices(8))
	const n = 300
	var claims []*resourceapi.ResourceClaim
	for i := range n {
		var c *resourceapi.ResourceClaim
		switch i % 3 {
		case 0, 1:
			c = claim("s"+strconv.Itoa(i), share("gpu", "gpu-0", "s-"+strconv.Itoa(i), 32<<20, 0))
			if i%3 == 1 {
				c = claim("s"+strconv.Itoa(i), share("gpu", "gpu-0", "s-"+strconv.Itoa(i), 48<<20, 1))
			}
		default:
			// Time slices of gpu-1: only 8 exist, so most of these must fail.
			c = claim("t"+strconv.Itoa(i), device("ts", "gpu-1-ts-"+strconv.Itoa(i%8)))
		}
		claims = append(claims, c)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		ok   []*resourceapi.ResourceClaim
		fail int
	)
	for _, c := range claims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.p.Prepare(e.ctx, c)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				fail++
				if !strings.Contains(err.Error(), "already prepared") && !strings.Contains(err.Error(), "oversubscribed") {
					t.Errorf("%s: %v", c.Name, err)
				}
				return
			}
			ok = append(ok, c)
		}()
	}
	wg.Wait()
	perSlice := map[string]int{}
	var used int64
	for _, c := range ok {
		r := c.Status.Allocation.Devices.Results[0]
		if strings.Contains(r.Device, "-ts-") {
			perSlice[r.Device]++
		} else {
			q := r.ConsumedCapacity["memory"]
			used += q.Value()
		}
	}
	for dev, k := range perSlice {
		if k != 1 {
			t.Errorf("%s prepared %d times", dev, k)
		}
	}
	if used > t4Usable {
		t.Errorf("gpu-0 oversubscribed: %d bytes", used)
	}
	if len(e.files("cdi")) != len(ok) {
		t.Errorf("%d specs for %d prepared claims", len(e.files("cdi")), len(ok))
	}
	t.Logf("%d prepared, %d refused", len(ok), fail)
	for _, c := range claims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.p.Unprepare(e.ctx, types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, c.UID); err != nil {
				t.Errorf("unprepare %s: %v", c.Name, err)
			}
		}()
	}
	wg.Wait()
	e.assertClean()
}

// TestStaticMIG uses an existing MIG instance and leaves it at unprepare.
func TestStaticMIG(t *testing.T) {
	e := newEnv(t, withMIG(), func(e *env) { e.cfg.MIGMode = "static" })
	gpu := e.inv.GPUs[0]
	var prof inventory.MIGProfile
	for _, p := range gpu.MIGProfiles {
		if p.Name == "2g.10gb" {
			prof = p
		}
	}
	tmpl, err := mig.Template(gpu, prof, 4)
	if err != nil {
		t.Fatal(err)
	}
	unlock := e.opts.MIG.Lock(gpu.UUID)
	inst, err := e.opts.MIG.Create(e.ctx, tmpl, nil)
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	e.start() // rediscover: the instance is now published
	c := claim("static", device("mig", "gpu-0-mig-2g10gb-4"))
	ids := e.prepare(c)
	env, _ := e.inject(ids...)
	if env["NVIDIA_VISIBLE_DEVICES"] != inst.UUID || env["TESSERA_MODE"] != "mig" {
		t.Errorf("env %v, instance %s", env, inst.UUID)
	}
	if _, err := e.p.Prepare(e.ctx, claim("other", device("mig", "gpu-0-mig-2g10gb-4"))); err == nil {
		t.Error("one static MIG device prepared for two claims")
	}
	if _, err := e.p.Prepare(e.ctx, claim("missing", device("mig", "gpu-0-mig-2g10gb-0"))); err == nil {
		t.Error("a MIG device that does not exist was prepared")
	}
	e.unprepare(c)
	if e.migInstances() != 1 {
		t.Errorf("static instance destroyed: %d left", e.migInstances())
	}
	if len(e.files("cdi")) != 0 || len(e.files("checkpoint")) != 0 {
		t.Errorf("left: %v %v", e.files("cdi"), e.files("checkpoint"))
	}
}

// TestFloor: a claim below its class's or the node's enforcement floor, or
// one that sets the floor itself, fails to prepare with an error naming
// the cause, and nothing of it is left (no spec, record, accounting
// directory or MIG instance); hardware isolation meets any floor.
func TestFloor(t *testing.T) {
	lib := filepath.Join(t.TempDir(), "libvgpu.so")
	tests := []struct {
		name    string
		opts    []envOption
		floor   v1alpha1.EnforcementMode // node
		claim   *resourceapi.ResourceClaim
		wantErr []string
	}{
		{
			name:    "claim sets the floor",
			opts:    []envOption{withInterposer(lib)},
			claim:   withConfig(claim("c", share("gpu", "gpu-0", "s-1", gib, 0)), resourceapi.AllocationConfigSourceClaim, nil, `"minEnforcement":"none"`),
			wantErr: []string{"claim configuration", "minEnforcement", "only a DeviceClass's configuration may set"},
		},
		{
			name: "claim asks for less than its class",
			opts: []envOption{withInterposer(lib)},
			claim: withConfig(withConfig(claim("c", share("gpu", "gpu-0", "s-1", gib, 0)),
				resourceapi.AllocationConfigSourceClass, nil, `"minEnforcement":"interposer"`),
				resourceapi.AllocationConfigSourceClaim, nil, `"enforcement":"none"`),
			wantErr: []string{"device gpu-0", "enforcement none is weaker than the floor interposer set by its DeviceClass"},
		},
		{
			name:    "node cannot deliver its own floor",
			floor:   v1alpha1.EnforcementInterposer,
			claim:   claim("c", share("gpu", "gpu-0", "s-1", gib, 0)),
			wantErr: []string{"floor interposer set by this node (--min-enforcement) cannot be delivered", "no interposer library"},
		},
		{
			name:    "node floor under a dynamic MIG device",
			opts:    []envOption{withMIG()},
			floor:   v1alpha1.EnforcementInterposer,
			claim:   claim("c", device("mig", "gpu-0-mig-1g5gb-0")),
			wantErr: nil,
		},
		{
			name:  "class floor met",
			opts:  []envOption{withInterposer(lib)},
			claim: withConfig(claim("c", share("gpu", "gpu-0", "s-1", gib, 0)), resourceapi.AllocationConfigSourceClass, nil, `"minEnforcement":"interposer"`),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := append(tt.opts, func(e *env) { e.opts.Enforce.MinEnforcement = tt.floor })
			e := newEnv(t, opts...)
			if tt.wantErr == nil {
				e.prepare(tt.claim)
				e.unprepare(tt.claim)
				e.assertClean()
				return
			}
			_, err := e.p.Prepare(e.ctx, tt.claim)
			if err == nil {
				t.Fatalf("prepared; want an error with %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			e.assertClean()
		})
	}
}

// TestAccountingTmpfs: an interposer claim's accounting directory is its
// own size-limited tmpfs, fresh at every prepare, and unprepare (or the
// unprepare of a claim whose record was lost) unmounts and removes it.
func TestAccountingTmpfs(t *testing.T) {
	lib := filepath.Join(t.TempDir(), "libvgpu.so")
	e := newEnv(t, withInterposer(lib))
	if err := (interposercache.Dirs{Root: e.opts.AccountingDir}).Probe(); err != nil {
		t.Skipf("cannot mount here: %v", err)
	}
	e.opts.AccountingSize = 1 << 20
	e.p = New(e.opts)
	c := withConfig(claim("c", share("gpu", "gpu-0", "s-1", gib, 0)), resourceapi.AllocationConfigSourceClaim, nil, `"enforcement":"interposer"`)
	e.prepare(c)
	dir := filepath.Join(e.opts.AccountingDir, string(c.UID))
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC || uint64(fs.Blocks)*uint64(fs.Bsize) != 1<<20 {
		t.Fatalf("accounting directory: type %#x, size %d, %v; want a 1 MiB tmpfs", fs.Type, uint64(fs.Blocks)*uint64(fs.Bsize), err)
	}
	e.unprepare(c)
	e.assertClean()

	// A leftover mount without a record (a crash, a lost checkpoint) is
	// removed by the kubelet's unprepare.
	e.prepare(c)
	if err := e.opts.Checkpoints.Delete(string(c.UID)); err != nil {
		t.Fatal(err)
	}
	e.p = New(e.opts)
	if err := e.p.Unprepare(e.ctx, types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, c.UID); err != nil {
		t.Fatal(err)
	}
	if mounted, err := interposercache.IsMountPoint(dir); mounted || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("leftover accounting directory: mounted %v, %v", mounted, err)
	}
	e.assertClean()
}

// TestMPSPerClaim: a claim in mps mode gets its own MPS daemon with the
// limits set on the daemon side, and only its pipe directory is mounted;
// a plugin restart restarts a daemon that is gone; unprepare stops it.
func TestMPSPerClaim(t *testing.T) {
	e := newEnv(t, withMPSPerClaim())
	a := withConfig(claim("a", share("gpu", "gpu-0", "s-1", gib, 30)), resourceapi.AllocationConfigSourceClaim, nil, `"enforcement":"mps"`)
	b := claim("b", share("gpu", "gpu-0", "s-2", 2*gib, 0)) // auto resolves to mps
	pipes := map[string]string{}
	for _, c := range []*resourceapi.ResourceClaim{a, b} {
		env, _ := e.inject(e.prepare(c)...)
		if env["TESSERA_MODE"] != "mps" || env["TESSERA_ENFORCED"] != "mps" || env["CUDA_MPS_PIPE_DIRECTORY"] != enforce.MPSPipeDir {
			t.Errorf("%s: env %v", c.Name, env)
		}
		var host []string
		for _, m := range e.lastMounts {
			if m.Destination == enforce.MPSPipeDir {
				host = append(host, m.Source)
			}
		}
		want := e.opts.MPS.PipeDir(string(c.UID))
		if !slices.Equal(host, []string{want}) {
			t.Fatalf("%s: pipe mounts %v, want only %s", c.Name, host, want)
		}
		pipes[c.Name] = want
		if !e.opts.MPS.Running(t.Context(), string(c.UID)) {
			t.Errorf("%s: no daemon", c.Name)
		}
	}
	uuid := e.inv.GPUs[0].UUID
	cmds, _ := os.ReadFile(filepath.Join(pipes["a"], "commands"))
	if want := "set_default_device_pinned_mem_limit " + uuid + " 1024M\nset_default_active_thread_percentage 30\n"; string(cmds) != want {
		t.Errorf("claim a's daemon got %q, want %q", cmds, want)
	}
	cmds, _ = os.ReadFile(filepath.Join(pipes["b"], "commands"))
	// b asks for no cores: its class's computeDefault (uncapped, the
	// default) sets no active thread percentage.
	if want := "set_default_device_pinned_mem_limit " + uuid + " 2048M\n"; string(cmds) != want {
		t.Errorf("claim b's daemon got %q, want %q", cmds, want)
	}

	// The daemon of a is gone (a node or container restart): the plugin's
	// restart starts it again with the recorded limits.
	if err := os.Remove(filepath.Join(pipes["a"], "control")); err != nil {
		t.Fatal(err)
	}
	e.start()
	if !e.opts.MPS.Running(t.Context(), string(a.UID)) {
		t.Fatal("daemon of a not restarted")
	}
	cmds, _ = os.ReadFile(filepath.Join(pipes["a"], "commands"))
	if !strings.Contains(string(cmds), "set_default_active_thread_percentage 30") {
		t.Errorf("restarted daemon got %q", cmds)
	}

	e.unprepare(a)
	if _, err := os.Stat(pipes["a"]); !os.IsNotExist(err) {
		t.Errorf("a's pipe directory left: %v", err)
	}
	if !e.opts.MPS.Running(t.Context(), string(b.UID)) {
		t.Error("unprepare of a stopped b's daemon")
	}
	e.unprepare(b)
	e.assertClean()
}

// TestComputeDefault: a share that asks for no cores is capped by its
// class's computeDefault (uncapped unless the class says proportional);
// the spec's SM limit, the recorded compute limit and the claim status
// agree; a claim that sets computeDefault itself fails to prepare.
func TestComputeDefault(t *testing.T) {
	lib := filepath.Join(t.TempDir(), "libvgpu.so")
	tests := []struct {
		name    string
		claim   *resourceapi.ResourceClaim
		wantSM  string // CUDA_DEVICE_SM_LIMIT_0
		wantErr []string
	}{
		{
			// Work-conserving: no SM limit unless the class asks for one.
			name:   "default is uncapped",
			claim:  claim("c", share("gpu", "gpu-0", "s-1", gib, 0)),
			wantSM: "100",
		},
		{
			// 1 GiB of the T4's 15104 MiB usable memory is 6.8 %.
			name:   "class proportional",
			claim:  withConfig(claim("c", share("gpu", "gpu-0", "s-1", gib, 0)), resourceapi.AllocationConfigSourceClass, nil, `"computeDefault":"proportional"`),
			wantSM: "7",
		},
		{
			name:   "class proportional, cores requested",
			claim:  withConfig(claim("c", share("gpu", "gpu-0", "s-1", gib, 40)), resourceapi.AllocationConfigSourceClass, nil, `"computeDefault":"proportional"`),
			wantSM: "40",
		},
		{
			name:   "class uncapped",
			claim:  withConfig(claim("c", share("gpu", "gpu-0", "s-1", gib, 0)), resourceapi.AllocationConfigSourceClass, nil, `"computeDefault":"uncapped"`),
			wantSM: "100",
		},
		{
			name:    "claim sets the compute default",
			claim:   withConfig(claim("c", share("gpu", "gpu-0", "s-1", gib, 0)), resourceapi.AllocationConfigSourceClaim, nil, `"computeDefault":"uncapped"`),
			wantErr: []string{"claim configuration", "computeDefault", "only a DeviceClass's configuration may set"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, withInterposer(lib))
			if tt.wantErr != nil {
				_, err := e.p.Prepare(e.ctx, tt.claim)
				if err == nil {
					t.Fatalf("prepared; want an error with %q", tt.wantErr)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				e.assertClean()
				return
			}
			ids := e.prepare(tt.claim)
			env, _ := e.inject(ids...)
			if env["CUDA_DEVICE_SM_LIMIT_0"] != tt.wantSM || env["TESSERA_COMPUTE_LIMIT"] != tt.wantSM {
				t.Errorf("SM limit %q, TESSERA_COMPUTE_LIMIT %q; want %s", env["CUDA_DEVICE_SM_LIMIT_0"], env["TESSERA_COMPUTE_LIMIT"], tt.wantSM)
			}
			seen := 0
			for _, rec := range e.p.Claims() {
				for _, st := range StatusDevices("gpu.tessera.dev", rec, nil) {
					seen++
					var data StatusData
					if err := json.Unmarshal(st.Data.Raw, &data); err != nil {
						t.Fatal(err)
					}
					if strconv.Itoa(data.ComputeLimit) != tt.wantSM {
						t.Errorf("status computeLimit %d, want %s", data.ComputeLimit, tt.wantSM)
					}
				}
			}
			if seen != 1 {
				t.Errorf("%d status entries, want 1", seen)
			}
			e.unprepare(tt.claim)
			e.assertClean()
		})
	}
}

// locatedDaemons is an in-process daemon runner that says where a claim's
// daemon runs, as the daemon pods do.
type locatedDaemons struct{ mps.Manager }

func (locatedDaemons) Where(uid string) string { return "tessera-system/tessera-mps-" + uid }

// TestMPSDaemonLocationRecorded: the checkpoint records where a claim's
// daemon runs when the runner says (a daemon pod), and nothing otherwise.
func TestMPSDaemonLocationRecorded(t *testing.T) {
	for _, tc := range []struct {
		name    string
		located bool
	}{{"daemon pods", true}, {"in process", false}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, withMPSPerClaim())
			if tc.located {
				e.opts.MPS = locatedDaemons{Manager: *e.opts.MPS.(*mps.Manager)}
				e.start()
			}
			c := withConfig(claim("a", share("gpu", "gpu-0", "s-1", gib, 0)), resourceapi.AllocationConfigSourceClaim, nil, `"enforcement":"mps"`)
			e.prepare(c)
			rec := e.p.record(string(c.UID))
			if rec == nil || rec.MPS == nil {
				t.Fatalf("record %+v: no MPS daemon recorded", rec)
			}
			want := ""
			if tc.located {
				want = "tessera-system/tessera-mps-" + string(c.UID)
			}
			if rec.MPS.Pod != want {
				t.Errorf("recorded daemon pod %q, want %q", rec.MPS.Pod, want)
			}
			e.unprepare(c)
			e.assertClean()
		})
	}
}
