package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/node/coexist"
	"github.com/tessera-dev/tessera/pkg/node/health"
	"github.com/tessera-dev/tessera/pkg/node/nvmlsource"
	"github.com/tessera-dev/tessera/pkg/node/prepare"
	"github.com/tessera-dev/tessera/pkg/node/publish"
)

// Layout of the plugin data directory (besides the kubelet socket).
const (
	checkpointDir = "checkpoint"
	accountingDir = "accounting"
	mpsDir        = "mps"
	// claimFilesDir holds a directory per claim for files its containers
	// mount read-only (interposer mode's ld.so.preload).
	claimFilesDir = "claims"
	mockDevDir    = "mock-dev"
	// hookDir holds the nvidia-cdi-hook the plugin installs on the host.
	hookDir = "bin"
	// MockTimeSliceFile records the mock GPUs' time-slice intervals in the
	// mock state directory.
	MockTimeSliceFile = "mock-timeslice.json"
	defaultBootIDPath = "/proc/sys/kernel/random/boot_id"
	repairInterval    = 30 * time.Second
	injectInterval    = 500 * time.Millisecond
)

// Driver implements kubeletplugin.DRAPlugin.
type Driver struct {
	opts      *Options
	backend   *nvmlsource.Backend
	client    kubernetes.Interface
	helper    *kubeletplugin.Helper
	publisher *publish.Publisher
	modelCfg  devicemodel.Config
	preparer  *prepare.Preparer
	health    *health.Monitor
	status    *statusWriter
	metrics   *metrics
	usage     usageState

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// healthServer answers the probes (nil without --healthcheck-port).
	healthServer *healthServer

	mu sync.Mutex
	// fatal is the error that stopped the plugin, if any.
	fatal error
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// Run starts the plugin and blocks until ctx ends.
func Run(ctx context.Context, o *Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	client, err := kubeClient(o.Kubeconfig)
	if err != nil {
		return err
	}
	d, err := Start(ctx, o, client)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-d.ctx.Done():
	}
	d.Stop()
	return d.fatalErr()
}

func (d *Driver) fatalErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.fatal
}

// Start starts the plugin with a given client and returns once it serves
// the kubelet. Stop it with Stop.
func Start(ctx context.Context, o *Options, client kubernetes.Interface) (_ *Driver, finalErr error) {
	logger := klog.FromContext(ctx)
	if err := o.Validate(); err != nil {
		return nil, err
	}
	modelCfg, err := o.DeviceModelConfig()
	if err != nil {
		return nil, err
	}
	if o.InterposerLibrary != "" {
		if st, err := os.Stat(o.InterposerLibrary); err != nil || !st.Mode().IsRegular() {
			return nil, fmt.Errorf("--interposer-library=%s must name the interposer's shared library file on the node (e.g. /usr/local/vgpu/libvgpu.so): %v", o.InterposerLibrary, err)
		}
	}
	if o.MPSPipeDir != "" {
		if st, err := os.Stat(o.MPSPipeDir); err != nil || !st.IsDir() {
			logger.Info("Warning: --mps-pipe-dir does not exist (yet); claims in mps mode get no daemon until it does", "dir", o.MPSPipeDir)
		}
	}
	bo := o.Backend
	bo.Seed = o.NodeName
	bo.MockProcRoot = o.HostProcRoot
	if bo.MockStateDir == "" && bo.Kind == nvmlsource.Mock {
		bo.MockStateDir = o.PluginDataDir
	}
	if err := os.MkdirAll(o.PluginDataDir, 0o750); err != nil {
		return nil, fmt.Errorf("--plugin-data-dir: %w", err)
	}
	if err := os.MkdirAll(o.RegistrarDir, 0o750); err != nil {
		return nil, fmt.Errorf("--registrar-dir: %w", err)
	}
	be, err := nvmlsource.Open(bo)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	d := &Driver{opts: o, backend: be, client: client, modelCfg: modelCfg, ctx: ctx, cancel: cancel}
	defer func() {
		if finalErr != nil {
			d.Stop()
		}
	}()
	fatal, err := health.ParseFatalEffect(o.HealthFatalEffect)
	if err != nil {
		return nil, fmt.Errorf("--health-fatal-effect: %w", err)
	}
	d.health = health.New(be, o.NodeName, health.Options{IgnoredXIDs: xids(o.HealthIgnoredXIDs), FatalEffect: fatal, HoldDown: o.HealthHoldDown,
		OnChange: func() {
			if d.publisher != nil {
				d.publisher.Trigger()
			}
		}})
	d.publisher = publish.NewPublisher(be, o.NodeName, d.deviceModelConfig, func(ctx context.Context, r resourceslice.DriverResources) error {
		return d.helper.PublishResources(ctx, r)
	})
	// Discover before serving so that prepare has an inventory.
	if err := d.publisher.Refresh(ctx); err != nil {
		return nil, err
	}
	// Coexistence: GPUs the device plugin or another DRA driver already
	// hands out are not published (unless --allow-shared-gpus).
	if conflicts, err := coexist.Conflicts(ctx, client, o.NodeName, devicemodel.DriverName, d.publisher.Inventory().GPUs); err != nil {
		logger.Error(err, "Could not check whether another component advertises this node's GPUs; publishing them")
	} else {
		coexist.Report(ctx, client, o.NodeName, "tessera-kubelet-plugin", conflicts, o.AllowSharedGPUs)
		if !o.AllowSharedGPUs && len(conflicts) > 0 {
			d.modelCfg.Excluded = conflicts
			if err := d.publisher.Refresh(ctx); err != nil {
				return nil, err
			}
		}
	}
	d.status = newStatusWriter(client, devicemodel.DriverName)
	d.preparer, err = d.newPreparer(ctx, bo)
	if err != nil {
		return nil, err
	}
	if err := d.preparer.Recover(ctx); err != nil {
		return nil, fmt.Errorf("recover prepared claims: %w", err)
	}
	d.goRun(func() { d.status.Run(ctx, 2) })
	if o.MetricsBindAddress != "" && o.MetricsBindAddress != "0" {
		d.metrics = newMetrics(d)
		d.metrics.serve(ctx, o.MetricsBindAddress)
	}
	if o.UsageInterval > 0 {
		d.goRun(func() { d.runUsage(ctx, o.UsageInterval) })
	}
	if len(d.preparer.Pending()) > 0 {
		d.goRun(func() { d.preparer.RunRepairs(ctx, repairInterval) })
	}
	inv := d.publisher.Inventory()
	d.goRun(func() {
		if err := d.health.Run(ctx, inv); err != nil {
			logger.Error(err, "GPU health monitoring stopped")
		}
	})
	d.goRun(func() { be.WatchFaults(ctx, injectInterval) })
	helper, err := kubeletplugin.Start(ctx, d, d.pluginOptions()...)
	if err != nil {
		return nil, fmt.Errorf("start kubelet plugin: %w", err)
	}
	d.helper = helper
	if o.HealthcheckPort >= 0 || o.HealthcheckSocket != "" {
		if d.healthServer, err = startHealthServer(ctx, d); err != nil {
			return nil, err
		}
	}
	// Publishing starts in the background: the ResourceSlice controller
	// takes a second to sync its informer, and a restarted plugin must
	// answer the kubelet for claims prepared earlier without that delay.
	d.goRun(func() {
		if err := d.publisher.Sync(ctx); err != nil {
			logger.Error(err, "Publishing ResourceSlices failed; retrying at the next rescan")
		}
		d.publisher.Run(ctx, o.RescanInterval)
	})
	logger.Info("Tessera kubelet plugin running", "node", o.NodeName, "backend", o.Backend.Kind, "prepared", len(d.preparer.Prepared()))
	return d, nil
}

func (d *Driver) goRun(f func()) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		f()
	}()
}

// Stop stops serving and waits for background work to end.
func (d *Driver) Stop() {
	d.cancel()
	if d.healthServer != nil {
		d.healthServer.stop()
	}
	if d.helper != nil {
		d.helper.Stop()
	}
	d.wg.Wait()
	if err := d.backend.Close(); err != nil {
		klog.FromContext(d.ctx).Error(err, "Shutting down the GPU backend")
	}
}

// pluginOptions configure the kubelet plugin library. Alone, the plugin
// prepares claims in parallel (it serializes per claim and per GPU
// itself). With --pod-uid the library's rolling-update mode lets an old
// and a new plugin pod serve side by side; the library then serializes
// every kubelet call across both through a lock file, and the preparer
// shares its records through the checkpoint directory (prepare/shared.go).
func (d *Driver) pluginOptions() []kubeletplugin.Option {
	o := d.opts
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(devicemodel.DriverName),
		kubeletplugin.KubeClient(d.client),
		kubeletplugin.NodeName(o.NodeName),
		kubeletplugin.RegistrarDirectoryPath(o.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(o.PluginDataDir),
		kubeletplugin.CDIDirectory(o.CDIRoot),
		kubeletplugin.Serialize(o.PodUID != ""),
	}
	if o.PodUID != "" {
		opts = append(opts, kubeletplugin.RollingUpdate(types.UID(o.PodUID)))
	}
	return opts
}

// deviceModelConfig is the node configuration plus the health taints of
// every device with a fault (health.Monitor.Taints) and, in dynamic MIG mode, the rule that leaves out
// placements blocked by MIG instances no prepared claim owns.
func (d *Driver) deviceModelConfig() devicemodel.Config {
	cfg := d.modelCfg
	if cfg.MIGMode == devicemodel.MIGDynamic && d.preparer != nil {
		cfg.ForeignMIG = func(gpuUUID string, inst inventory.MIGInstance) bool {
			return !d.preparer.OwnsMIG(gpuUUID, inst.GIProfileID, inst.Placement.Start)
		}
	}
	if d.health == nil || d.publisher == nil {
		return cfg
	}
	inv := d.publisher.Inventory()
	if inv == nil {
		return cfg
	}
	if taints := d.health.Taints(inv, d.deviceNames(inv)); len(taints) > 0 {
		cfg.Taints = taints
	}
	return cfg
}

// deviceNames are the devices the node publishes.
func (d *Driver) deviceNames(inv *inventory.Inventory) []string {
	slices, err := devicemodel.Build(inv, d.modelCfg)
	if err != nil {
		return nil
	}
	var names []string
	for _, s := range slices {
		for _, dev := range s.Devices {
			names = append(names, dev.Name)
		}
	}
	return names
}

// getClaim reads one claim for the preparer's repairs (prepare.ClaimGetter).
func (d *Driver) getClaim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	return d.client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin. Claims are
// prepared in parallel; a failure fails only its claim.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (_ map[types.UID]kubeletplugin.PrepareResult, finalErr error) {
	done, err := d.shared(ctx)
	if err != nil {
		return nil, err
	}
	defer done(&finalErr)
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	var mu sync.Mutex
	parallel(ctx, len(claims), func(i int) {
		c := claims[i]
		start := time.Now()
		devices, err := d.preparer.Prepare(ctx, c)
		d.metrics.observePrepare(c, time.Since(start), err)
		if err != nil {
			err = fmt.Errorf("prepare claim %s/%s: %w", c.Namespace, c.Name, err)
			klog.FromContext(ctx).Error(err, "Prepare failed", "claim", klog.KObj(c))
		}
		mu.Lock()
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devices, Err: err}
		mu.Unlock()
	})
	return out, nil
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (_ map[types.UID]error, finalErr error) {
	done, err := d.shared(ctx)
	if err != nil {
		return nil, err
	}
	defer done(&finalErr)
	out := make(map[types.UID]error, len(claims))
	var mu sync.Mutex
	parallel(ctx, len(claims), func(i int) {
		c := claims[i]
		err := d.preparer.Unprepare(ctx, c.NamespacedName, c.UID)
		if err != nil {
			err = fmt.Errorf("unprepare claim %s: %w", c.String(), err)
			klog.FromContext(ctx).Error(err, "Unprepare failed")
		}
		mu.Lock()
		out[c.UID] = err
		mu.Unlock()
	})
	return out, nil
}

// shared brackets a kubelet call in rolling-update mode (the library
// holds the lock across both processes): it reloads what the other
// process changed, and the returned func publishes what this one changed.
func (d *Driver) shared(ctx context.Context) (func(*error), error) {
	if err := d.preparer.SyncShared(ctx); err != nil {
		return nil, fmt.Errorf("reload prepared claims: %w", err)
	}
	return func(finalErr *error) {
		if err := d.preparer.PublishShared(); err != nil && *finalErr == nil {
			*finalErr = err
		}
	}, nil
}

// parallel runs f for each of n claims of one kubelet call, all at once. It
// runs every claim even when ctx ends meanwhile: each claim gets a result
// (the preparer sees ctx and fails the claims it cannot finish).
func parallel(ctx context.Context, n int, f func(int)) {
	workqueue.ParallelizeUntil(context.WithoutCancel(ctx), n, n, f)
}

// HandleError implements kubeletplugin.DRAPlugin.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		klog.FromContext(ctx).Error(err, msg)
		return
	}
	klog.FromContext(ctx).Error(err, msg+"; stopping")
	d.mu.Lock()
	if d.fatal == nil {
		d.fatal = fmt.Errorf("%s: %w", msg, err)
	}
	d.mu.Unlock()
	d.cancel()
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin from NVML events.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return d.health.Watch(ctx, reports, func() (*inventory.Inventory, []string) {
		inv := d.publisher.Inventory()
		return inv, d.deviceNames(inv)
	})
}

func xids(in []uint) []uint64 {
	out := make([]uint64, 0, len(in))
	for _, x := range in {
		out = append(out, uint64(x))
	}
	return out
}

func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	return kubernetes.NewForConfig(cfg)
}
