package enforce

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

func floorCfg(mode, floor v1alpha1.EnforcementMode) *v1alpha1.GpuConfig {
	c := cfg(mode)
	c.MinEnforcement = floor
	return c
}

// TestFloor: a device whose effective enforcement is weaker than the
// stronger of its class's floor and the node's fails, saying who set the
// floor and whether the claim asked for less or the node lacks the means;
// hardware isolation satisfies any floor.
func TestFloor(t *testing.T) {
	mpsRoot := t.TempDir()
	if err := os.MkdirAll(filepath.Join(mpsRoot, gpu0), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mpsRoot, gpu0, "control"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	lib := "/opt/hami/libvgpu.so"
	const (
		none  = v1alpha1.EnforcementNone
		mps   = v1alpha1.EnforcementMPS
		inter = v1alpha1.EnforcementInterposer
		auto  = v1alpha1.EnforcementAuto
	)
	whole := share("gpu-0", gpu0, 15*gib, 0, floorCfg(none, inter))
	whole.Whole = true
	tests := []struct {
		name    string
		alloc   Allocation
		node    Node
		wantErr []string // all must appear; empty: prepare succeeds
	}{
		{name: "no floor, none", alloc: share("gpu-0", gpu0, gib, 0, floorCfg(none, ""))},
		{name: "class floor none allows none", alloc: share("gpu-0", gpu0, gib, 0, floorCfg(none, none))},
		{name: "class floor interposer refuses none", alloc: share("gpu-0", gpu0, gib, 0, floorCfg(none, inter)),
			node:    Node{InterposerLibrary: lib},
			wantErr: []string{"device gpu-0", "enforcement none is weaker than the floor interposer", "its DeviceClass (minEnforcement)", "use enforcement interposer or auto"}},
		{name: "class floor interposer refuses mps", alloc: share("gpu-0", gpu0, gib, 0, floorCfg(mps, inter)),
			node:    Node{InterposerLibrary: lib, MPSPipeDir: mpsRoot},
			wantErr: []string{"enforcement mps is weaker than the floor interposer"}},
		{name: "class floor interposer, node without library", alloc: share("gpu-0", gpu0, gib, 0, floorCfg(inter, inter)),
			wantErr: []string{"cannot be delivered on this node", "no interposer library (--interposer-library)"}},
		{name: "class floor interposer, auto on an MPS-only node", alloc: share("gpu-0", gpu0, gib, 0, floorCfg(auto, inter)),
			node:    Node{MPSPipeDir: mpsRoot},
			wantErr: []string{"enforcement auto resolved to mps", "no interposer library"}},
		{name: "class floor interposer met", alloc: share("gpu-0", gpu0, gib, 0, floorCfg(auto, inter)), node: Node{InterposerLibrary: lib}},
		{name: "class floor mps met by the interposer", alloc: share("gpu-0", gpu0, gib, 0, floorCfg(inter, mps)), node: Node{InterposerLibrary: lib}},
		{name: "class floor mps met by a daemon", alloc: share("gpu-0", gpu0, gib, 0, floorCfg(mps, mps)), node: Node{MPSPipeDir: mpsRoot}},
		{name: "class floor mps, GPU without daemon", alloc: share("gpu-1", gpu1, gib, 0, floorCfg(mps, mps)),
			node:    Node{MPSPipeDir: mpsRoot},
			wantErr: []string{"device gpu-1", "no MPS daemon for GPU " + gpu1}},
		{name: "class floor mps, auto on a bare node", alloc: share("gpu-0", gpu0, gib, 0, floorCfg(auto, mps)),
			wantErr: []string{"enforcement auto resolved to none", "no MPS daemon"}},
		{name: "class floor mps refuses none", alloc: share("gpu-0", gpu0, gib, 0, floorCfg(none, mps)), node: Node{MPSPipeDir: mpsRoot},
			wantErr: []string{"enforcement none is weaker than the floor mps"}},
		{name: "node floor refuses none", alloc: share("gpu-0", gpu0, gib, 0, floorCfg(none, "")),
			node:    Node{InterposerLibrary: lib, MinEnforcement: inter},
			wantErr: []string{"floor interposer set by this node (--min-enforcement)"}},
		{name: "node floor stronger than the class's", alloc: share("gpu-0", gpu0, gib, 0, floorCfg(mps, mps)),
			node:    Node{MPSPipeDir: mpsRoot, MinEnforcement: inter},
			wantErr: []string{"floor interposer set by this node"}},
		{name: "class floor stronger than the node's", alloc: share("gpu-0", gpu0, gib, 0, floorCfg(mps, inter)),
			node:    Node{MPSPipeDir: mpsRoot, MinEnforcement: mps},
			wantErr: []string{"floor interposer set by its DeviceClass"}},
		{name: "exclusive GPU satisfies any floor", alloc: whole, node: Node{MinEnforcement: inter}},
		{name: "mig satisfies any floor", alloc: Allocation{Request: "mig", Device: "gpu-0-mig-1g10gb-3", Type: devicemodel.TypeMIG, UUID: migUUID, GPUUUID: gpu0,
			Memory: 9856 * mib, ReportedTotal: 9856 * mib, Config: floorCfg(none, inter)}, node: Node{MinEnforcement: inter}},
		{name: "time slice is held to the floor", alloc: Allocation{Request: "ts", Device: "gpu-0-ts-1", Type: devicemodel.TypeTimeSlice, UUID: gpu0, GPUUUID: gpu0,
			Memory: 4 * gib, ReportedTotal: 16 * gib, Config: floorCfg(none, mps)}, wantErr: []string{"device gpu-0-ts-1", "weaker than the floor mps"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Plan(Claim{Namespace: "ns", Name: "c", UID: "u"}, []Allocation{tt.alloc}, tt.node, "/x")
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("prepared; want an error with %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
