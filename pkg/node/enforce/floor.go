package enforce

import (
	"fmt"
	"strings"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// levelRank places what enforces a device on the floor's scale
// (v1alpha1.EnforcementFloors): advisory is none.
func levelRank(l Level) int {
	switch l {
	case Interposer:
		return v1alpha1.FloorRank(v1alpha1.EnforcementInterposer)
	case MPS:
		return v1alpha1.FloorRank(v1alpha1.EnforcementMPS)
	}
	return 0
}

// modeRank is the best a mode can deliver on any node, on the floor's
// scale.
func modeRank(m Mode) int {
	switch m {
	case ModeInterposer:
		return levelRank(Interposer)
	case ModeMPS:
		return levelRank(MPS)
	}
	return 0
}

// checkFloor fails a device whose effective enforcement is weaker than the
// stronger of its class's floor and the node's. MIG devices and exclusive
// GPUs are isolated without software and satisfy every floor. The error
// says who set the floor and whether the claim asked for less or the node
// cannot deliver it.
func checkFloor(v visibleDevice, a Allocation, node Node) error {
	if v.Mode == ModeMIG || v.Mode == ModeExclusive {
		return nil
	}
	floor := v1alpha1.MaxFloor(a.Config.MinEnforcement, node.MinEnforcement)
	want := v1alpha1.FloorRank(floor)
	if want <= 0 || levelRank(v.Enforced) >= want {
		return nil
	}
	who := "its DeviceClass (minEnforcement)"
	if v1alpha1.FloorRank(node.MinEnforcement) >= v1alpha1.FloorRank(a.Config.MinEnforcement) {
		who = "this node (--min-enforcement)"
	}
	dev := strings.Join(v.Devices, "+")
	asked := a.Config.Enforcement
	if asked != v1alpha1.EnforcementAuto && modeRank(v.Mode) < want {
		return fmt.Errorf("device %s: enforcement %s is weaker than the floor %s set by %s; refusing to prepare: use enforcement %s or auto",
			dev, asked, floor, who, floor)
	}
	missing := "no interposer library (--interposer-library)"
	if floor == v1alpha1.EnforcementMPS && v.Mode != ModeInterposer {
		missing = fmt.Sprintf("no MPS daemon for GPU %s (--mps-control for one per claim, or --mps-pipe-dir)", a.GPUUUID)
	}
	return fmt.Errorf("device %s: the floor %s set by %s cannot be delivered on this node: enforcement %s resolved to %s and the node has %s; refusing to prepare",
		dev, floor, who, asked, v.Mode, missing)
}
