package enforce

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/node/mps"
)

func TestDifferentMPSDaemonsConflict(t *testing.T) {
	root := t.TempDir()
	for _, g := range []string{gpu0, gpu1} {
		if err := os.MkdirAll(filepath.Join(root, g), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, g, "control"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Plan(Claim{UID: "u"}, []Allocation{
		share("gpu-0", gpu0, gib, 0, cfg(v1alpha1.EnforcementMPS)),
		share("gpu-1", gpu1, gib, 0, cfg(v1alpha1.EnforcementMPS)),
	}, Node{MPSPipeDir: root}, "/x")
	if err == nil || !strings.Contains(err.Error(), "different MPS daemons") {
		t.Fatalf("error %v", err)
	}
}

// TestMPSPerClaim: with a daemon per claim, mps devices are enforced by
// the claim's own daemon, whose limits Plan returns, and only its pipe
// directory is mounted; auto resolves to mps without a node daemon.
func TestMPSPerClaim(t *testing.T) {
	claim := Claim{Namespace: "ns", Name: "c", UID: "u", MPSPipeDir: "/var/lib/tessera/mps/u/pipe"}
	node := Node{MPSPerClaim: true, MinEnforcement: v1alpha1.EnforcementMPS}
	res, err := Plan(claim, []Allocation{
		share("gpu-0", gpu0, 4*gib, 40, cfg(v1alpha1.EnforcementMPS)),
		share("gpu-1", gpu1, 2*gib, 20, cfg("")),
	}, node, "/x")
	if err != nil {
		t.Fatal(err)
	}
	if res.MPS == nil || res.MPS.ThreadPercent != 20 || len(res.MPS.Devices) != 2 ||
		res.MPS.Devices[0] != (mps.Device{UUID: gpu0, MemMiB: 4096}) || res.MPS.Devices[1] != (mps.Device{UUID: gpu1, MemMiB: 2048}) {
		t.Errorf("daemon limits %+v", res.MPS)
	}
	if len(res.Mounts) != 1 || res.Mounts[0].HostPath != claim.MPSPipeDir || res.Mounts[0].ContainerPath != MPSPipeDir {
		t.Errorf("mounts %+v", res.Mounts)
	}
	for _, v := range res.Visible {
		if v.Enforced != MPS {
			t.Errorf("%v: enforced %s", v.Devices, v.Enforced)
		}
	}
	// Not mps: no daemon.
	res, err = Plan(claim, []Allocation{share("gpu-0", gpu0, 4*gib, 0, cfg(v1alpha1.EnforcementNone))}, Node{MPSPerClaim: true}, "/x")
	if err != nil || res.MPS != nil {
		t.Errorf("mode none: daemon %+v, %v", res.MPS, err)
	}
}
