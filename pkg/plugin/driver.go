package plugin

import (
	"context"
	"fmt"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/backend"
	"github.com/tessera-dev/tessera/pkg/devicemodel"
	"github.com/tessera-dev/tessera/pkg/publish"
)

// Driver implements kubeletplugin.DRAPlugin.
type Driver struct {
	opts      *Options
	backend   *backend.Backend
	client    kubernetes.Interface
	helper    *kubeletplugin.Helper
	publisher *publish.Publisher
	modelCfg  devicemodel.Config
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// Run starts the plugin and blocks until ctx ends.
func Run(ctx context.Context, o *Options) error {
	logger := klog.FromContext(ctx)
	if err := o.Validate(); err != nil {
		return err
	}
	modelCfg, err := o.DeviceModelConfig()
	if err != nil {
		return err
	}
	bo := o.Backend
	bo.Seed = o.NodeName
	if bo.MockStateDir == "" && bo.Kind == backend.Mock {
		bo.MockStateDir = o.PluginDataDir
	}
	if err := os.MkdirAll(o.PluginDataDir, 0o750); err != nil {
		return fmt.Errorf("--plugin-data-dir: %w", err)
	}
	be, err := backend.Open(bo)
	if err != nil {
		return err
	}
	defer be.Shutdown()

	client, err := kubeClient(o.Kubeconfig)
	if err != nil {
		return err
	}
	d := &Driver{opts: o, backend: be, client: client, modelCfg: modelCfg}
	d.publisher = publish.NewPublisher(be, o.NodeName, d.deviceModelConfig, func(ctx context.Context, r resourceslice.DriverResources) error {
		return d.helper.PublishResources(ctx, r)
	})
	// Discover before serving so that prepare has an inventory.
	if err := d.publisher.Refresh(ctx); err != nil {
		return err
	}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(devicemodel.DriverName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(o.NodeName),
		kubeletplugin.RegistrarDirectoryPath(o.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(o.PluginDataDir),
		kubeletplugin.CDIDirectory(o.CDIRoot),
	)
	if err != nil {
		return fmt.Errorf("start kubelet plugin: %w", err)
	}
	d.helper = helper
	defer helper.Stop()
	if err := d.publisher.Sync(ctx); err != nil {
		return fmt.Errorf("publish ResourceSlices: %w", err)
	}
	logger.Info("Tessera kubelet plugin running", "node", o.NodeName, "backend", o.Backend.Kind)
	d.publisher.Run(ctx, o.RescanInterval)
	return nil
}

func (d *Driver) deviceModelConfig() devicemodel.Config { return d.modelCfg }

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		out[c.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare is not implemented yet")}
	}
	return out, nil
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

// HandleError implements kubeletplugin.DRAPlugin.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
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
