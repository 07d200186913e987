package prepare

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/node/cdispec"
	"github.com/tessera-dev/tessera/pkg/node/checkpoint"
	"github.com/tessera-dev/tessera/pkg/node/enforce"
	"github.com/tessera-dev/tessera/pkg/node/mig"
	"github.com/tessera-dev/tessera/pkg/node/mps"
	"github.com/tessera-dev/tessera/pkg/node/timeslice"
)

// StatusWriter publishes what was prepared in the claim's status.devices.
// It must not block: prepare never waits for the API server.
type StatusWriter interface {
	Set(ctx context.Context, claim types.NamespacedName, uid types.UID, devices []resourceapi.AllocatedDeviceStatus)
	Clear(ctx context.Context, claim types.NamespacedName, uid types.UID)
}

// Options wire a Preparer to the node.
type Options struct {
	DriverName string
	// NodeName is the name of this node's pool.
	NodeName    string
	Checkpoints *checkpoint.Store
	CDI         cdispec.Dir
	Nodes       cdispec.DeviceNodes
	// DriverFiles, when set, gives every claim's containers the node's
	// NVIDIA driver files (libraries, binaries, firmware, hooks).
	DriverFiles DriverFiles
	MIG         *mig.Manager
	MIGMode     devicemodel.MIGMode
	// MIGDestroyUnknown destroys, at start, MIG instances on dynamically
	// partitioned GPUs that no record owns (--mig-destroy-unknown).
	MIGDestroyUnknown bool
	// MIGChanged, when set, is called after MIG instances Tessera did not
	// create were destroyed (the publisher rediscovers).
	MIGChanged func()
	TimeSlice  *timeslice.Manager
	Enforce    enforce.Node
	// AccountingDir holds a directory per claim for the interposer's
	// shared accounting file.
	AccountingDir string
	// AccountingSize bounds each claim's accounting tmpfs in bytes (0:
	// interposercache.DefaultSize).
	AccountingSize uint64
	// AccountingUnbounded makes plain directories instead of tmpfs mounts,
	// for a plugin that may not mount.
	AccountingUnbounded bool
	// ClaimFilesDir holds a directory per claim for the files the plugin
	// writes for its containers (the ld.so.preload file of interposer
	// mode), mounted read-only; empty: <checkpoint dir>/../claims.
	ClaimFilesDir string
	// MPS starts one MPS control daemon per claim in mps mode; nil when
	// the node does not (then node daemons, Enforce.MPSPipeDir, serve).
	MPS mps.Daemons
	// Model returns the current inventory and device-model configuration.
	Model  func() (*inventory.Inventory, devicemodel.Config)
	Status StatusWriter
	// GetClaim reads one ResourceClaim from the API server; only used to
	// repair records that were lost (see Recover).
	GetClaim ClaimGetter
	// Crash, when set, is called at named points of prepare and unprepare
	// (crash-injection tests kill the process there).
	Crash func(point string)
	// SharedLock, when set, is the lock file another plugin process shares
	// with this one during a seamless upgrade: the records are then
	// reloaded and published around every call (see shared.go).
	SharedLock string
}

// DriverFiles are the container edits that bring the node's driver into a
// container (see package driverfiles).
type DriverFiles interface {
	Edits(ctx context.Context) (cdispecs.ContainerEdits, error)
}

// Crash points, in the order prepare and unprepare pass them.
const (
	CrashPrepareStarted     = "prepare:started"
	CrashPrepareTimeSlice   = "prepare:timeslice"
	CrashPrepareMIGCreated  = "prepare:mig-created"
	CrashPrepareSpec        = "prepare:spec"
	CrashPrepareCompleted   = "prepare:completed"
	CrashUnprepareSpec      = "unprepare:spec"
	CrashUnprepareMIG       = "unprepare:mig"
	CrashUnprepareTimeSlice = "unprepare:timeslice"
	CrashUnprepareDone      = "unprepare:checkpoint"
)

// CrashPoints lists every crash point.
var CrashPoints = []string{
	CrashPrepareStarted, CrashPrepareTimeSlice, CrashPrepareMIGCreated, CrashPrepareSpec, CrashPrepareCompleted, CrashUnprepareSpec, CrashUnprepareMIG, CrashUnprepareTimeSlice, CrashUnprepareDone,
}

// crash passes a crash point (Options.Crash).
func (p *Preparer) crash(point string) {
	if p.opts.Crash != nil {
		p.opts.Crash(point)
	}
}
