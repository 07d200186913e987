package prepare

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/node/enforce"
	"github.com/tessera-dev/tessera/pkg/node/interposercache"
	"github.com/tessera-dev/tessera/pkg/node/mps"
)

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
