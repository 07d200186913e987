// What the plugin hands prepare: the preparer and its node-side pieces
// (driver files, MPS daemons, claim status writes, the shared lock).

package plugin

import (
	"context"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/node/cdispec"
	"github.com/tessera-dev/tessera/pkg/node/checkpoint"
	"github.com/tessera-dev/tessera/pkg/node/driverfiles"
	"github.com/tessera-dev/tessera/pkg/node/enforce"
	"github.com/tessera-dev/tessera/pkg/node/interposercache"
	"github.com/tessera-dev/tessera/pkg/node/mig"
	"github.com/tessera-dev/tessera/pkg/node/mps"
	"github.com/tessera-dev/tessera/pkg/node/mpspod"
	"github.com/tessera-dev/tessera/pkg/node/nvmlsource"
	"github.com/tessera-dev/tessera/pkg/node/prepare"
	"github.com/tessera-dev/tessera/pkg/node/timeslice"
)

// sharedLock is the plugin library's lock file in rolling-update mode
// (kubeletplugin: <plugin data dir>/serialize.lock), which the preparer
// takes too for work outside kubelet calls.
func (o *Options) sharedLock() string {
	if o.PodUID == "" {
		return ""
	}
	return filepath.Join(o.PluginDataDir, "serialize.lock")
}

func (d *Driver) newPreparer(ctx context.Context, bo nvmlsource.Options) (*prepare.Preparer, error) {
	o := d.opts
	bootPath := o.BootIDPath
	if bootPath == "" {
		bootPath = defaultBootIDPath
	}
	store, err := checkpoint.Open(filepath.Join(o.PluginDataDir, checkpointDir), checkpoint.ReadBootID(bootPath))
	if err != nil {
		return nil, err
	}
	var (
		nodes  cdispec.DeviceNodes
		setter timeslice.Setter
	)
	if d.backend.Mock != nil {
		root := o.MockDeviceRoot
		if root == "" {
			root = filepath.Join(o.PluginDataDir, mockDevDir)
		}
		nodes = cdispec.NewMockNodes(root)
		setter = &timeslice.FileRecorder{Path: filepath.Join(bo.MockStateDir, MockTimeSliceFile)}
	} else {
		devRoot := o.ContainerDevRoot
		if devRoot == "" {
			devRoot = o.DevRoot
		}
		nodes = cdispec.HostNodes{DevRoot: devRoot, HostDevRoot: o.DevRoot, ProcRoot: "/proc"}
		setter = timeslice.NvidiaSMI{Path: o.NvidiaSMI}
	}
	acct := interposercache.Dirs{Root: filepath.Join(o.PluginDataDir, accountingDir), Size: o.accountingSize}
	if !o.AccountingTmpfs {
		klog.FromContext(ctx).Info("Warning: accounting directories are plain directories without a size limit (--accounting-tmpfs=false)")
		acct.Unbounded = true
	} else if err := acct.Probe(); err != nil {
		// Without CAP_SYS_ADMIN (the chart's unprivileged mock mode) the
		// directories are plain and their size is not bounded.
		klog.FromContext(ctx).Info("Warning: accounting directories are not size-limited tmpfs mounts; the plugin cannot mount", "err", err)
		acct.Unbounded = true
	}
	mpsDaemons, err := d.mpsDaemons()
	if err != nil {
		return nil, err
	}
	files, err := d.driverFiles(ctx)
	if err != nil {
		return nil, err
	}
	return prepare.New(prepare.Options{
		DriverName:        devicemodel.DriverName,
		NodeName:          o.NodeName,
		Checkpoints:       store,
		CDI:               cdispec.Dir{Path: o.CDIRoot},
		Nodes:             nodes,
		DriverFiles:       files,
		MIG:               mig.New(d.backend),
		MIGMode:           d.modelCfg.MIGMode,
		MIGDestroyUnknown: o.MIGDestroyUnknown,
		MIGChanged: func() {
			if err := d.publisher.Refresh(ctx); err != nil {
				klog.FromContext(ctx).Error(err, "Rediscovery after destroying unknown MIG instances failed")
			}
		},
		TimeSlice:     timeslice.NewManager(setter),
		Enforce:       enforce.Node{InterposerLibrary: o.InterposerLibrary, MPSPipeDir: o.MPSPipeDir, MinEnforcement: v1alpha1.EnforcementMode(o.MinEnforcement), MPSPerClaim: mpsDaemons != nil},
		MPS:           mpsDaemons,
		AccountingDir: acct.Root, AccountingSize: acct.Size, AccountingUnbounded: acct.Unbounded,
		ClaimFilesDir: filepath.Join(o.PluginDataDir, claimFilesDir),
		Model: func() (*inventory.Inventory, devicemodel.Config) {
			return d.publisher.Inventory(), d.modelCfg
		},
		Status:     d.statusWriter(),
		GetClaim:   d.getClaim,
		Crash:      o.crash,
		SharedLock: o.sharedLock(),
	}), nil
}

// statusWriter is the claim status writer, nil without a cluster.
func (d *Driver) statusWriter() prepare.StatusWriter {
	if d.status == nil {
		return nil
	}
	return d.status
}

// driverFiles are the driver edits every claim gets: none in mock mode
// without --driver-root; otherwise from --driver-root, with the hook the
// plugin installs on the host unless --nvidia-cdi-hook-path names one.
func (d *Driver) driverFiles(ctx context.Context) (prepare.DriverFiles, error) {
	o := d.opts
	root := o.DriverRoot
	if root == "" {
		if d.backend.Mock != nil {
			return nil, nil
		}
		root = "/"
	}
	hook := o.NvidiaCDIHookPath
	if hook == "" {
		src, err := driverfiles.BundledHook()
		if err != nil {
			return nil, err
		}
		hook, err = driverfiles.InstallHook(src, filepath.Join(o.PluginDataDir, hookDir))
		if err != nil {
			return nil, err
		}
	}
	files, err := driverfiles.New(driverfiles.Options{DriverRoot: root, ContainerDriverRoot: o.ContainerDriverRoot, HookPath: hook, NVML: d.backend, DisabledHooks: o.DisabledCDIHooks})
	if err != nil {
		return nil, err
	}
	// Fail at start, not at the first claim, when the driver root holds no
	// driver of NVML's version.
	if _, err := files.Edits(ctx); err != nil {
		return nil, err
	}
	klog.FromContext(ctx).Info("Claims get the NVIDIA driver's files", "driverRoot", root, "hook", hook)
	return files, nil
}

// mpsDaemons returns what runs the per-claim MPS daemons: nil without
// --mps-control, the plugin's own process or a Pod per claim.
func (d *Driver) mpsDaemons() (mps.Daemons, error) {
	o := d.opts
	if o.MPSControl == "" {
		return nil, nil
	}
	root := filepath.Join(o.PluginDataDir, mpsDir)
	if o.MPSMode != MPSPod {
		m := mps.Manager{Root: root, Control: mps.Exec{Path: o.MPSControl}}
		if d.backend.Mock != nil {
			m.Control = mps.Fake{}
		}
		return m, nil
	}
	control := o.MPSControl
	if d.backend.Mock != nil {
		control = mps.FakeControl
	}
	cfg := mpspod.Config{
		Namespace:           o.MPSDaemonNamespace,
		NodeName:            o.NodeName,
		Image:               o.MPSDaemonImage,
		ImagePullPolicy:     corev1.PullPolicy(o.MPSDaemonPullPolicy),
		Binary:              o.MPSDaemonBinary,
		Control:             control,
		DriverRoot:          o.DriverRoot,
		ContainerDriverRoot: o.ContainerDriverRoot,
		Root:                root,
		PriorityClassName:   o.MPSDaemonPriorityClass,
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &mpspod.Daemons{Config: cfg, Client: d.client}, nil
}
