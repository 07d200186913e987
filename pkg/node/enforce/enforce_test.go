package enforce

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

const (
	gib     = uint64(1) << 30
	mib     = uint64(1) << 20
	gpu0    = "GPU-00000000-0000-0000-0000-000000000000"
	gpu1    = "GPU-11111111-1111-1111-1111-111111111111"
	migUUID = "MIG-22222222-2222-2222-2222-222222222222"
)

func cfg(mode v1alpha1.EnforcementMode, caps ...v1alpha1.FrameworkCap) *v1alpha1.GpuConfig {
	c := &v1alpha1.GpuConfig{Enforcement: mode, FrameworkCaps: caps}
	c.Normalize()
	return c
}

// uncapped is c with computeDefault uncapped (the default, set
// explicitly): a share without cores keeps no SM limit.
func uncapped(c *v1alpha1.GpuConfig) *v1alpha1.GpuConfig {
	c = c.DeepCopy()
	c.ComputeDefault = v1alpha1.ComputeUncapped
	return c
}

// proportional is c with computeDefault proportional: a share without
// cores is capped at its memory fraction.
func proportional(c *v1alpha1.GpuConfig) *v1alpha1.GpuConfig {
	c = c.DeepCopy()
	c.ComputeDefault = v1alpha1.ComputeProportional
	return c
}

func share(device, uuid string, mem uint64, cores int, c *v1alpha1.GpuConfig) Allocation {
	return Allocation{Request: "gpu", Device: device, Type: devicemodel.TypeGPU, UUID: uuid, GPUUUID: uuid, Memory: mem, Cores: cores, Usable: 16 * gib, ReportedTotal: 16 * gib, Config: c}
}

func TestPlan(t *testing.T) {
	mpsRoot := t.TempDir()
	if err := os.MkdirAll(filepath.Join(mpsRoot, gpu0), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mpsRoot, gpu0, "control"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	claim := Claim{Namespace: "ns", Name: "c", UID: "uid-1", ShareKey: "abc"}
	lib := "/opt/hami/libvgpu.so"
	tests := []struct {
		name     string
		allocs   []Allocation
		node     Node
		want     []string // exact entries
		absent   []string // variable names that must not be set
		mounts   []string // container paths
		levels   []Level
		wantErr  string
		accounts bool
	}{
		{
			name:   "interposer share with library",
			allocs: []Allocation{share("gpu-0", gpu0, 4*gib, 30, cfg(v1alpha1.EnforcementInterposer))},
			node:   Node{InterposerLibrary: lib},
			want: []string{
				"NVIDIA_VISIBLE_DEVICES=" + gpu0, "CUDA_VISIBLE_DEVICES=" + gpu0,
				"CUDA_DEVICE_MEMORY_LIMIT_0=4096m", "CUDA_DEVICE_SM_LIMIT_0=30",
				"CUDA_DEVICE_MEMORY_LIMIT=4096m", "CUDA_DEVICE_SM_LIMIT=30", "GPU_CORE_UTILIZATION_POLICY=force",
				"CUDA_DEVICE_MEMORY_SHARED_CACHE=/run/tessera/uid-1/vgpu-abc.cache",
				"LD_PRELOAD=/usr/local/tessera/lib/libvgpu.so",
				"TESSERA_MODE=interposer", "TESSERA_ENFORCED=interposer", "TESSERA_DEVICE=gpu-0",
				"TESSERA_MEMORY_LIMIT=4294967296", "TESSERA_COMPUTE_LIMIT=30", "TESSERA_CLAIM=ns/c",
			},
			absent:   []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "PYTORCH_CUDA_ALLOC_CONF"},
			mounts:   []string{"/run/tessera/uid-1", "/usr/local/tessera/lib/libvgpu.so", "/overrideEnv"},
			levels:   []Level{Interposer},
			accounts: true,
		},
		{
			name:   "interposer without library is advisory and not preloaded",
			allocs: []Allocation{share("gpu-0", gpu0, 1536*mib, 0, uncapped(cfg(v1alpha1.EnforcementInterposer)))},
			want: []string{"CUDA_DEVICE_MEMORY_LIMIT_0=1536m", "CUDA_DEVICE_MEMORY_LIMIT=1536m", "CUDA_DEVICE_SM_LIMIT_0=100", "CUDA_DEVICE_SM_LIMIT=100",
				"GPU_CORE_UTILIZATION_POLICY=force", "TESSERA_ENFORCED=advisory", "TESSERA_MODE=interposer", "TESSERA_COMPUTE_LIMIT=100"},
			absent:   []string{"LD_PRELOAD"},
			mounts:   []string{"/run/tessera/uid-1"},
			levels:   []Level{Advisory},
			accounts: true,
		},
		{
			name:   "mps with daemon",
			allocs: []Allocation{share("gpu-0", gpu0, 4*gib, 50, cfg(v1alpha1.EnforcementMPS))},
			node:   Node{MPSPipeDir: mpsRoot},
			want: []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
				"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "TESSERA_MODE=mps", "TESSERA_ENFORCED=mps"},
			absent: []string{"CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_MEMORY_LIMIT", "GPU_CORE_UTILIZATION_POLICY", "LD_PRELOAD", "CUDA_DEVICE_MEMORY_SHARED_CACHE"},
			mounts: []string{"/tmp/nvidia-mps"},
			levels: []Level{MPS},
		},
		{
			name:   "mps without daemon",
			allocs: []Allocation{share("gpu-1", gpu1, 2*gib, 0, uncapped(cfg(v1alpha1.EnforcementMPS)))},
			node:   Node{MPSPipeDir: mpsRoot},
			want:   []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M", "TESSERA_ENFORCED=advisory"},
			absent: []string{"CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"},
			levels: []Level{Advisory},
		},
		{
			name:   "auto prefers the interposer",
			allocs: []Allocation{share("gpu-0", gpu0, 4*gib, 0, cfg(""))},
			node:   Node{InterposerLibrary: lib, MPSPipeDir: mpsRoot},
			want:   []string{"TESSERA_MODE=interposer", "TESSERA_ENFORCED=interposer"},
			levels: []Level{Interposer}, accounts: true,
			mounts: []string{"/run/tessera/uid-1", "/usr/local/tessera/lib/libvgpu.so", "/overrideEnv"},
		},
		{
			name:   "auto falls back to mps",
			allocs: []Allocation{share("gpu-0", gpu0, 4*gib, 0, cfg(""))},
			node:   Node{MPSPipeDir: mpsRoot},
			want:   []string{"TESSERA_MODE=mps", "TESSERA_ENFORCED=mps"},
			levels: []Level{MPS},
			mounts: []string{"/tmp/nvidia-mps"},
		},
		{
			name:   "auto on a bare node is accounting only",
			allocs: []Allocation{share("gpu-0", gpu0, 4*gib, 0, cfg(""))},
			want:   []string{"TESSERA_MODE=none", "TESSERA_ENFORCED=advisory", "TESSERA_MEMORY_LIMIT=4294967296"},
			absent: []string{"CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "LD_PRELOAD"},
			levels: []Level{Advisory},
		},
		{
			name: "whole GPU needs no cap",
			allocs: []Allocation{func() Allocation {
				a := share("gpu-0", gpu0, 15*gib, 0, cfg(v1alpha1.EnforcementInterposer))
				a.Whole = true
				return a
			}()},
			node:   Node{InterposerLibrary: lib},
			want:   []string{"TESSERA_MODE=exclusive", "TESSERA_ENFORCED=hard", "TESSERA_COMPUTE_LIMIT=100"},
			absent: []string{"CUDA_DEVICE_MEMORY_LIMIT_0", "LD_PRELOAD", "CUDA_DEVICE_MEMORY_SHARED_CACHE"},
			levels: []Level{Hard},
		},
		{
			name: "mig is hardware",
			allocs: []Allocation{{Request: "mig", Device: "gpu-0-mig-1g10gb-3", Type: devicemodel.TypeMIG, UUID: migUUID, GPUUUID: gpu0,
				Memory: 9856 * mib, ReportedTotal: 9856 * mib, Config: cfg(v1alpha1.EnforcementMPS, v1alpha1.FrameworkCapPyTorch)}},
			node: Node{MPSPipeDir: mpsRoot},
			want: []string{"NVIDIA_VISIBLE_DEVICES=" + migUUID, "CUDA_VISIBLE_DEVICES=" + migUUID, "TESSERA_MODE=mig", "TESSERA_ENFORCED=hard",
				"PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:1.000"},
			absent: []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"},
			levels: []Level{Hard},
		},
		{
			name: "time slice with framework caps",
			allocs: []Allocation{{Request: "ts", Device: "gpu-0-ts-1", Type: devicemodel.TypeTimeSlice, UUID: gpu0, GPUUUID: gpu0,
				Memory: 4 * gib, ReportedTotal: 16 * gib, Config: cfg(v1alpha1.EnforcementNone, v1alpha1.FrameworkCapPyTorch, v1alpha1.FrameworkCapXLA)}},
			want: []string{"TESSERA_MODE=none", "TESSERA_DEVICE=gpu-0-ts-1",
				"PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:0.250", "XLA_CLIENT_MEM_FRACTION=0.250", "XLA_PYTHON_CLIENT_MEM_FRACTION=0.250"},
			levels: []Level{Advisory},
		},
		{
			name: "two GPUs are indexed in allocation order",
			allocs: []Allocation{
				share("gpu-1", gpu1, 2*gib, 20, cfg(v1alpha1.EnforcementInterposer)),
				share("gpu-0", gpu0, 3*gib, 0, uncapped(cfg(v1alpha1.EnforcementInterposer))),
			},
			node: Node{InterposerLibrary: lib},
			want: []string{"CUDA_VISIBLE_DEVICES=" + gpu1 + "," + gpu0, "CUDA_DEVICE_MEMORY_LIMIT_0=2048m", "CUDA_DEVICE_SM_LIMIT_0=20",
				"CUDA_DEVICE_MEMORY_LIMIT_1=3072m", "CUDA_DEVICE_SM_LIMIT_1=100", "CUDA_DEVICE_MEMORY_LIMIT=2048m", "CUDA_DEVICE_SM_LIMIT=20",
				"TESSERA_DEVICE=gpu-1,gpu-0", "TESSERA_MEMORY_LIMIT=2147483648,3221225472", "TESSERA_COMPUTE_LIMIT=20,100"},
			absent:   []string{"CUDA_DEVICE_MEMORY_LIMIT_2"},
			levels:   []Level{Interposer, Interposer},
			accounts: true,
			mounts:   []string{"/run/tessera/uid-1", "/usr/local/tessera/lib/libvgpu.so", "/overrideEnv"},
		},
		{
			name: "two shares of one GPU add up",
			allocs: []Allocation{
				share("gpu-0", gpu0, 2*gib, 20, cfg(v1alpha1.EnforcementInterposer)),
				share("gpu-0", gpu0, 1*gib, 10, cfg(v1alpha1.EnforcementInterposer)),
			},
			want:     []string{"CUDA_VISIBLE_DEVICES=" + gpu0, "CUDA_DEVICE_MEMORY_LIMIT_0=3072m", "CUDA_DEVICE_SM_LIMIT_0=30", "TESSERA_DEVICE=gpu-0"},
			absent:   []string{"CUDA_DEVICE_MEMORY_LIMIT_1"},
			levels:   []Level{Advisory},
			accounts: true,
			mounts:   []string{"/run/tessera/uid-1"},
		},
		{
			name: "a MIG device next to an interposer share is not capped by the fallback",
			allocs: []Allocation{
				share("gpu-1", gpu1, 2*gib, 25, cfg(v1alpha1.EnforcementInterposer)),
				{Request: "mig", Device: "gpu-0-mig-1g10gb-3", Type: devicemodel.TypeMIG, UUID: migUUID, GPUUUID: gpu0,
					Memory: 9856 * mib, ReportedTotal: 9856 * mib, Config: cfg("")},
			},
			node: Node{InterposerLibrary: lib},
			want: []string{"CUDA_DEVICE_MEMORY_LIMIT_0=2048m", "CUDA_DEVICE_SM_LIMIT_0=25", "CUDA_DEVICE_MEMORY_LIMIT_1=9856m", "CUDA_DEVICE_SM_LIMIT_1=100",
				"CUDA_DEVICE_MEMORY_LIMIT=2048m", "CUDA_DEVICE_SM_LIMIT=25", "GPU_CORE_UTILIZATION_POLICY=force", "TESSERA_ENFORCED=interposer,hard"},
			levels:   []Level{Interposer, Hard},
			accounts: true,
			mounts:   []string{"/run/tessera/uid-1", "/usr/local/tessera/lib/libvgpu.so", "/overrideEnv"},
		},
		{
			name: "shares of one GPU with different modes conflict",
			allocs: []Allocation{
				share("gpu-0", gpu0, 2*gib, 0, cfg(v1alpha1.EnforcementInterposer)),
				share("gpu-0", gpu0, 1*gib, 0, cfg(v1alpha1.EnforcementMPS)),
			},
			wantErr: "different enforcement",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Plan(claim, tt.allocs, tt.node, "/var/lib/tessera/accounting/uid-1")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !slices.Contains(res.Env, w) {
					t.Errorf("missing %s in %v", w, res.Env)
				}
			}
			names := map[string]int{}
			for _, e := range res.Env {
				name, _, _ := strings.Cut(e, "=")
				names[name]++
			}
			for name, n := range names {
				if n > 1 {
					t.Errorf("%s set %d times", name, n)
				}
			}
			for _, a := range tt.absent {
				if names[a] > 0 {
					t.Errorf("%s must not be set: %v", a, res.Env)
				}
			}
			var mounts []string
			for _, m := range res.Mounts {
				mounts = append(mounts, m.ContainerPath)
			}
			if !slices.Equal(mounts, tt.mounts) {
				t.Errorf("mounts %v, want %v", mounts, tt.mounts)
			}
			var levels []Level
			for _, v := range res.Visible {
				levels = append(levels, v.Enforced)
			}
			if !slices.Equal(levels, tt.levels) {
				t.Errorf("levels %v, want %v", levels, tt.levels)
			}
			if (res.AccountingDir != "") != tt.accounts {
				t.Errorf("accounting dir %q, want one: %v", res.AccountingDir, tt.accounts)
			}
		})
	}
}

func TestFormatFraction(t *testing.T) {
	for in, want := range map[float64]string{0.25: "0.250", 0.33333: "0.333", 0.9999: "0.999", 1: "1.000", 1.5: "1.000"} {
		if got := formatFraction(in); got != want {
			t.Errorf("%v: %s, want %s", in, got, want)
		}
	}
}

func TestComputeCap(t *testing.T) {
	prop, unc := proportional(cfg(v1alpha1.EnforcementAuto)), uncapped(cfg(v1alpha1.EnforcementAuto))
	normalized := cfg(v1alpha1.EnforcementAuto)
	unset := &v1alpha1.GpuConfig{Enforcement: v1alpha1.EnforcementAuto} // not normalized
	with := func(a Allocation, f func(*Allocation)) Allocation { f(&a); return a }
	tests := []struct {
		name    string
		alloc   Allocation
		want    int
		wantErr string
	}{
		{"proportional exact quarter", share("gpu-0", gpu0, 4*gib, 0, prop), 25, ""},
		{"proportional rounds up", share("gpu-0", gpu0, gib, 0, prop), 7, ""}, // 6.25 %
		{"proportional at least 1", with(share("gpu-0", gpu0, 256*mib, 0, prop), func(a *Allocation) { a.Usable = 80 * gib }), 1, ""},
		{"proportional near the whole GPU", share("gpu-0", gpu0, 16*gib-mib, 0, prop), 100, ""},
		{"unset computeDefault is uncapped", share("gpu-0", gpu0, 8*gib, 0, unset), 0, ""},
		{"normalized default is uncapped", share("gpu-0", gpu0, 8*gib, 0, normalized), 0, ""},
		{"no configuration is uncapped", share("gpu-0", gpu0, 8*gib, 0, nil), 0, ""},
		{"uncapped", share("gpu-0", gpu0, 4*gib, 0, unc), 0, ""},
		{"requested cores win under proportional", share("gpu-0", gpu0, 4*gib, 60, prop), 60, ""},
		{"requested cores win under uncapped", share("gpu-0", gpu0, 4*gib, 10, unc), 10, ""},
		{"exclusive GPU is not capped", with(share("gpu-0", gpu0, 16*gib, 0, prop), func(a *Allocation) { a.Whole = true }), 0, ""},
		{"time slice is not capped", with(share("gpu-0-ts-1", gpu0, 4*gib, 0, prop), func(a *Allocation) { a.Type = devicemodel.TypeTimeSlice; a.Usable = 0 }), 0, ""},
		{"mig is not capped", with(share("gpu-0-mig-1g.5gb-0", migUUID, 5*gib, 0, prop), func(a *Allocation) { a.Type = devicemodel.TypeMIG; a.Usable = 0 }), 0, ""},
		{"usable unknown fails", with(share("gpu-0", gpu0, 4*gib, 0, prop), func(a *Allocation) { a.Usable = 0 }), 0, "usable memory is unknown"},
		{"usable unknown is fine when uncapped", with(share("gpu-0", gpu0, 4*gib, 0, unc), func(a *Allocation) { a.Usable = 0 }), 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ComputeCap(tt.alloc)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("ComputeCap = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestComputeDefaultEnv checks the environment of a share with and without
// cores under each compute default and enforcement mode: the SM limit the
// interposer or MPS gets and TESSERA_COMPUTE_LIMIT always agree with
// ComputeCap.
func TestComputeDefaultEnv(t *testing.T) {
	mpsRoot := t.TempDir()
	if err := os.MkdirAll(filepath.Join(mpsRoot, gpu0), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mpsRoot, gpu0, "control"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	claim := Claim{Namespace: "ns", Name: "c", UID: "uid-1", ShareKey: "abc", MPSPipeDir: "/var/lib/tessera/mps/uid-1"}
	interNode := Node{InterposerLibrary: "/opt/hami/libvgpu.so"}
	mpsNode := Node{MPSPipeDir: mpsRoot}
	perClaim := Node{MPSPerClaim: true}
	prop := func(m v1alpha1.EnforcementMode) *v1alpha1.GpuConfig { return proportional(cfg(m)) }
	unc := func(m v1alpha1.EnforcementMode) *v1alpha1.GpuConfig { return uncapped(cfg(m)) }
	inter, mpsMode, none := v1alpha1.EnforcementInterposer, v1alpha1.EnforcementMPS, v1alpha1.EnforcementNone
	tests := []struct {
		name      string
		allocs    []Allocation
		node      Node
		want      []string
		absent    []string
		mpsThread int // daemon-side thread percentage (per-claim daemon), -1: no daemon
	}{
		{"interposer, no cores, proportional", []Allocation{share("gpu-0", gpu0, 4*gib, 0, prop(inter))}, interNode,
			[]string{"CUDA_DEVICE_SM_LIMIT_0=25", "CUDA_DEVICE_SM_LIMIT=25", "GPU_CORE_UTILIZATION_POLICY=force", "TESSERA_COMPUTE_LIMIT=25", "TESSERA_ENFORCED=interposer"}, nil, -1},
		{"interposer, no cores, uncapped", []Allocation{share("gpu-0", gpu0, 4*gib, 0, unc(inter))}, interNode,
			[]string{"CUDA_DEVICE_SM_LIMIT_0=100", "CUDA_DEVICE_SM_LIMIT=100", "TESSERA_COMPUTE_LIMIT=100"}, nil, -1},
		{"interposer, cores, proportional", []Allocation{share("gpu-0", gpu0, 4*gib, 60, prop(inter))}, interNode,
			[]string{"CUDA_DEVICE_SM_LIMIT_0=60", "CUDA_DEVICE_SM_LIMIT=60", "TESSERA_COMPUTE_LIMIT=60"}, nil, -1},
		{"interposer, cores, uncapped", []Allocation{share("gpu-0", gpu0, 4*gib, 10, unc(inter))}, interNode,
			[]string{"CUDA_DEVICE_SM_LIMIT_0=10", "TESSERA_COMPUTE_LIMIT=10"}, nil, -1},
		{"mps node daemon, no cores, proportional", []Allocation{share("gpu-0", gpu0, gib, 0, prop(mpsMode))}, mpsNode,
			[]string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=7", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M", "TESSERA_COMPUTE_LIMIT=7", "TESSERA_ENFORCED=mps"}, nil, -1},
		{"mps node daemon, no cores, uncapped", []Allocation{share("gpu-0", gpu0, gib, 0, unc(mpsMode))}, mpsNode,
			[]string{"TESSERA_COMPUTE_LIMIT=100"}, []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}, -1},
		{"mps per-claim daemon, no cores, proportional", []Allocation{share("gpu-0", gpu0, 2*gib, 0, prop(mpsMode))}, perClaim,
			[]string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=13", "TESSERA_COMPUTE_LIMIT=13"}, nil, 13}, // 12.5 % rounded up
		{"mps per-claim daemon, no cores, uncapped", []Allocation{share("gpu-0", gpu0, 2*gib, 0, unc(mpsMode))}, perClaim,
			[]string{"TESSERA_COMPUTE_LIMIT=100"}, []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}, 0},
		{"mps per-claim daemon, cores, proportional", []Allocation{share("gpu-0", gpu0, 2*gib, 40, prop(mpsMode))}, perClaim,
			[]string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40", "TESSERA_COMPUTE_LIMIT=40"}, nil, 40},
		{"none, no cores, proportional is told", []Allocation{share("gpu-0", gpu0, 4*gib, 0, prop(none))}, Node{},
			[]string{"TESSERA_COMPUTE_LIMIT=25", "TESSERA_ENFORCED=advisory"}, []string{"CUDA_DEVICE_SM_LIMIT_0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}, -1},
		{"none, no cores, uncapped", []Allocation{share("gpu-0", gpu0, 4*gib, 0, unc(none))}, Node{},
			[]string{"TESSERA_COMPUTE_LIMIT=100"}, nil, -1},
		{"two proportional shares of one GPU add up", []Allocation{share("gpu-0", gpu0, gib, 0, prop(inter)), share("gpu-0", gpu0, 3*gib, 0, prop(inter))}, interNode,
			[]string{"CUDA_DEVICE_SM_LIMIT_0=26", "TESSERA_COMPUTE_LIMIT=26", "CUDA_DEVICE_MEMORY_LIMIT_0=4096m"}, nil, -1}, // 7 + 19
		{"a proportional and a requesting share of one GPU add up", []Allocation{share("gpu-0", gpu0, 4*gib, 0, prop(inter)), share("gpu-0", gpu0, gib, 30, prop(inter))}, interNode,
			[]string{"CUDA_DEVICE_SM_LIMIT_0=55", "TESSERA_COMPUTE_LIMIT=55"}, nil, -1},
		{"an uncapped share of one GPU lifts the cap", []Allocation{share("gpu-0", gpu0, 4*gib, 0, unc(inter)), share("gpu-0", gpu0, gib, 30, unc(inter))}, interNode,
			[]string{"CUDA_DEVICE_SM_LIMIT_0=100", "TESSERA_COMPUTE_LIMIT=100"}, nil, -1},
		{"exclusive GPU stays uncapped under proportional", []Allocation{func() Allocation {
			a := share("gpu-0", gpu0, 16*gib, 0, prop(inter))
			a.Whole = true
			return a
		}()}, interNode, []string{"TESSERA_COMPUTE_LIMIT=100", "TESSERA_ENFORCED=hard"}, []string{"CUDA_DEVICE_SM_LIMIT_0"}, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := slices.Clone(tt.allocs)
			res, err := Plan(claim, tt.allocs, tt.node, "/var/lib/tessera/accounting/uid-1")
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !slices.Contains(res.Env, w) {
					t.Errorf("missing %s in %v", w, res.Env)
				}
			}
			for _, name := range tt.absent {
				for _, e := range res.Env {
					if strings.HasPrefix(e, name+"=") {
						t.Errorf("%s must not be set: %v", name, res.Env)
					}
				}
			}
			switch {
			case tt.mpsThread < 0 && res.MPS != nil:
				t.Errorf("unexpected per-claim daemon limits %+v", res.MPS)
			case tt.mpsThread >= 0 && (res.MPS == nil || res.MPS.ThreadPercent != tt.mpsThread):
				t.Errorf("daemon limits %+v, want thread percentage %d", res.MPS, tt.mpsThread)
			}
			// The caller's allocations are not modified.
			for i := range before {
				if tt.allocs[i].Cores != before[i].Cores {
					t.Errorf("Plan changed the caller's allocation %d: cores %d -> %d", i, before[i].Cores, tt.allocs[i].Cores)
				}
			}
		})
	}
}
