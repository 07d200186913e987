package enforce

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-dev/tessera/pkg/node/mps"
)

// mpsPlan collects the MPS limits over a claim's visible devices
// (ModeMPS).
type mpsPlan struct {
	// pinned are the client-side memory limits, <index>=<MiB>M.
	pinned []string
	// threads is the smallest compute limit asked for, 0 for none.
	threads int
	// dir is the host pipe directory of the daemon serving the devices.
	dir string
	// limits are the daemon-side limits of the claim's own daemon
	// (Node.MPSPerClaim); nil otherwise.
	limits *mps.Limits
}

// device plans a device in mps mode, under the claim's own daemon or the
// node daemon serving its GPU. One claim can use one daemon only.
func (mp *mpsPlan) device(v *visibleDevice, claim Claim, node Node, visible []visibleDevice) error {
	a := v.alloc
	mib := a.Memory >> 20
	mp.pinned = append(mp.pinned, fmt.Sprintf("%d=%dM", v.Index, mib))
	if a.Cores > 0 && a.Cores < 100 && (mp.threads == 0 || a.Cores < mp.threads) {
		mp.threads = a.Cores
	}
	if node.MPSPerClaim {
		if mp.limits == nil {
			mp.limits = &mps.Limits{}
		}
		mp.limits.Devices = append(mp.limits.Devices, mps.Device{UUID: a.UUID, MemMiB: mib})
		mp.dir = claim.MPSPipeDir
		v.Enforced = MPS
		return nil
	}
	dir, ok := node.mpsDaemon(a.GPUUUID)
	if !ok {
		v.Note = "no MPS daemon serves this GPU (--mps-pipe-dir); the MPS limits take effect only under a daemon"
		return nil
	}
	if mp.dir != "" && mp.dir != dir {
		return fmt.Errorf("devices %s are served by different MPS daemons (%s and %s); one claim in mps mode can use only one daemon", strings.Join(deviceNames(visible), ", "), mp.dir, dir)
	}
	mp.dir = dir
	v.Enforced = MPS
	return nil
}

// apply appends the MPS variables to env and the daemon's pipe directory
// to res's mounts when a device is in mps mode, and sets the daemon-side
// limits of the claim's own daemon (Result.MPS).
func (mp *mpsPlan) apply(env []string, res *Result, claim Claim) ([]string, error) {
	if mp.limits != nil {
		if claim.MPSPipeDir == "" {
			return nil, fmt.Errorf("claim %s/%s: no pipe directory for its MPS daemon", claim.Namespace, claim.Name)
		}
		mp.limits.ThreadPercent = mp.threads
		res.MPS = mp.limits
	}
	if len(mp.pinned) == 0 {
		return env, nil
	}
	// Client-side limits too: the daemon's defaults are what a
	// tenant cannot raise; these only restate them.
	env = append(env, EnvMPSPinnedMem+"="+strings.Join(mp.pinned, ","))
	if mp.threads > 0 {
		env = append(env, fmt.Sprintf("%s=%d", EnvMPSThreads, mp.threads))
	}
	if mp.dir != "" {
		env = append(env, EnvMPSPipe+"="+MPSPipeDir)
		res.Mounts = append(res.Mounts, &cdispec.Mount{
			HostPath:      mp.dir,
			ContainerPath: MPSPipeDir,
			Options:       []string{"rw", "nosuid", "nodev", "bind"},
		})
	}
	return env, nil
}

// mpsDaemon returns the pipe directory of the MPS daemon serving a GPU.
func (n Node) mpsDaemon(gpuUUID string) (string, bool) {
	if n.MPSPipeDir == "" {
		return "", false
	}
	for _, dir := range []string{filepath.Join(n.MPSPipeDir, gpuUUID), n.MPSPipeDir} {
		if _, err := os.Stat(filepath.Join(dir, "control")); err == nil {
			return dir, true
		}
	}
	return "", false
}

func deviceNames(v []visibleDevice) []string {
	var out []string
	for _, d := range v {
		out = append(out, d.Devices...)
	}
	return out
}
