// Package plugin is Tessera's kubelet plugin: it wires the NVML backend,
// discovery, the device model and publishing to the kubelet plugin library,
// and serves NodePrepareResources / NodeUnprepareResources.
package plugin

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/pkg/backend"
	"github.com/tessera-dev/tessera/pkg/devicemodel"
	"github.com/tessera-dev/tessera/pkg/health"
)

// Options are the kubelet plugin's command-line options.
type Options struct {
	NodeName       string
	Kubeconfig     string
	Backend        backend.Options
	ReservedMemory string
	TimeSlices     int
	// TimeSlicesConfig is a YAML file mapping GPU index or UUID to N.
	TimeSlicesConfig string
	MIGMode          string
	RescanInterval   time.Duration
	CDIRoot          string
	PluginDataDir    string
	RegistrarDir     string
	// MockDeviceRoot is where fake /dev nodes live in mock mode.
	MockDeviceRoot    string
	InterposerLibrary string
	// DriverRoot is the NVIDIA driver installation's root on the host;
	// every claim's containers get its files. Empty: / with the nvml
	// backend, none in mock mode.
	DriverRoot string
	// ContainerDriverRoot is where the plugin sees DriverRoot.
	ContainerDriverRoot string
	// DevRoot is the host root that holds the NVIDIA device nodes' dev/.
	DevRoot string
	// ContainerDevRoot is where the plugin sees DevRoot.
	ContainerDevRoot string
	// NvidiaCDIHookPath is nvidia-cdi-hook on the host; empty: the plugin
	// installs its own copy into the plugin data directory.
	NvidiaCDIHookPath string
	PrintSlices       bool
	// MPSPipeDir is where the node's MPS control daemons keep their pipe
	// directories (<dir>/<gpu-uuid> or <dir> for one daemon for all GPUs).
	MPSPipeDir string
	// NvidiaSMI is the nvidia-smi binary that sets GPU time slices.
	NvidiaSMI string
	// HealthIgnoredXIDs are XIDs that do not make a device unhealthy.
	HealthIgnoredXIDs []uint
	// BootIDPath is where the node's boot ID is read (no flag; tests
	// change it). Empty means /proc/sys/kernel/random/boot_id.
	BootIDPath string

	// crash, when set, is called at named points of prepare and unprepare
	// (crash-injection tests).
	crash func(point string)
}

// AddFlags registers the options. The names are a contract: scripts and the
// Helm chart use them.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "Name of this node; also the pool name. Defaults to $NODE_NAME.")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "Path to a kubeconfig; empty means in-cluster configuration.")
	fs.StringVar(&o.Backend.Kind, "gpu-backend", backend.NVML, "Where GPUs come from: nvml (the node's NVIDIA driver) or mock (built-in mock GPUs).")
	fs.StringVar(&o.Backend.NVMLLibrary, "nvml-library", "", "Path of libnvidia-ml.so.1 for --gpu-backend=nvml (default: the loader's search path).")
	fs.StringVar(&o.Backend.MockProfile, "mock-profile", "t4:1", "Mock GPUs: <model>[:<count>][,...] with models t4, a10, l4, a100-40gb, h100-80gb, h200-141gb, b200-180gb, or a node: dgxa100, dgxh100, dgxh200, dgxb200.")
	fs.StringVar(&o.Backend.MockConfig, "mock-config", "", "YAML file describing the mock node (`gpus: [{model: t4, count: 2}]`); overrides --mock-profile.")
	fs.StringVar(&o.Backend.MockMIG, "mock-mig", "none", "Put MIG-capable mock GPUs in MIG mode (no instances created): all or none.")
	fs.StringVar(&o.Backend.MockStateDir, "mock-state-dir", "", "Where mock GPUs keep MIG state across restarts (default: the plugin data directory).")
	fs.StringVar(&o.ReservedMemory, "reserved-memory", "256Mi", "GPU memory held back per GPU for the driver and CUDA contexts; shares and time slices are carved from the rest.")
	fs.IntVar(&o.TimeSlices, "time-slices", 0, fmt.Sprintf("Time-slice partitions published per non-MIG GPU (gpu-<i>-ts-<k>), 0 to %d; 0 publishes none.", devicemodel.MaxTimeSlices))
	fs.StringVar(&o.TimeSlicesConfig, "time-slices-config", "", "YAML file overriding --time-slices per GPU, keyed by GPU index or UUID, e.g. `{\"0\": 4, \"1\": 0}`.")
	fs.StringVar(&o.MIGMode, "mig-mode", string(devicemodel.MIGDynamic), "How MIG-enabled GPUs are published: dynamic (every profile x placement, created at prepare) or static (existing instances).")
	fs.DurationVar(&o.RescanInterval, "rescan-interval", time.Minute, "How often GPUs are rediscovered and ResourceSlices republished if they changed.")
	fs.StringVar(&o.CDIRoot, "cdi-root", "/var/run/cdi", "Directory for the per-claim CDI specs.")
	fs.StringVar(&o.PluginDataDir, "plugin-data-dir", "/var/lib/kubelet/plugins/"+devicemodel.DriverName, "Plugin data directory: kubelet socket, checkpoint.")
	fs.StringVar(&o.RegistrarDir, "registrar-dir", "/var/lib/kubelet/plugins_registry", "Kubelet plugin registration directory.")
	fs.StringVar(&o.MockDeviceRoot, "mock-device-root", "", "In mock mode, directory holding fake device nodes (dev/nvidia0, ...) that CDI specs point at, so containers start without GPUs.")
	fs.StringVar(&o.InterposerLibrary, "interposer-library", "", "Path on the node of a HAMi-core compatible CUDA interposer (libvgpu.so); when set, shares and time slices enforced by the interposer (enforcement interposer, or auto) get it mounted and preloaded.")
	fs.StringVar(&o.DriverRoot, "driver-root", "", "Root of the NVIDIA driver installation on the host: / for a driver installed on the host, /run/nvidia/driver for the GPU operator's driver container, or a fixture driver root in mock mode. Every claim's containers get its libraries, binaries, firmware and hooks. Default: / with --gpu-backend=nvml, none in mock mode.")
	fs.StringVar(&o.ContainerDriverRoot, "container-driver-root", "", "Where the plugin sees --driver-root (the chart mounts it at /driver-root). Default: --driver-root itself.")
	fs.StringVar(&o.DevRoot, "dev-root", "/", "Host root whose dev/ holds the NVIDIA device nodes (--gpu-backend=nvml).")
	fs.StringVar(&o.ContainerDevRoot, "container-dev-root", "", "Where the plugin sees --dev-root; missing control nodes (nvidia-uvm, nvidia-uvm-tools) are created under it. Default: --dev-root itself.")
	fs.StringVar(&o.NvidiaCDIHookPath, "nvidia-cdi-hook-path", "", "Path ON THE HOST of the nvidia-cdi-hook executable the CDI specs name (container runtimes run hooks in the host's mount namespace). Default: the plugin copies the hook of its image into <plugin-data-dir>/bin and names that.")
	fs.BoolVar(&o.PrintSlices, "print-slices", false, "Print the ResourceSlices this node would publish as YAML and exit; needs no cluster.")
	fs.StringVar(&o.MPSPipeDir, "mps-pipe-dir", "", "Directory of the node's MPS control daemons: a GPU is served when <dir>/<gpu-uuid>/control (one daemon per GPU) or <dir>/control (one for all) exists; mps-mode claims get that pipe directory mounted.")
	fs.StringVar(&o.NvidiaSMI, "nvidia-smi", "nvidia-smi", "nvidia-smi binary used to set GPU time-slice intervals (--gpu-backend=nvml).")
	var ignored []uint
	for _, x := range health.DefaultIgnoredXIDs {
		ignored = append(ignored, uint(x))
	}
	fs.UintSliceVar(&o.HealthIgnoredXIDs, "health-ignored-xids", ignored, "XID errors caused by applications that do not make a GPU unhealthy; any other XID taints the device.")
}

// DeviceModelConfig validates the options that shape the device model.
func (o *Options) DeviceModelConfig() (devicemodel.Config, error) {
	cfg := devicemodel.Config{TimeSlices: o.TimeSlices, MIGMode: devicemodel.MIGMode(o.MIGMode)}
	q, err := resource.ParseQuantity(o.ReservedMemory)
	if err != nil || q.Sign() < 0 {
		return cfg, fmt.Errorf("--reserved-memory=%q is not a valid memory size: use a quantity such as 256Mi or 1Gi", o.ReservedMemory)
	}
	cfg.ReservedMemory = uint64(q.Value())
	if o.TimeSlicesConfig != "" {
		data, err := os.ReadFile(o.TimeSlicesConfig)
		if err != nil {
			return cfg, fmt.Errorf("--time-slices-config: %w", err)
		}
		raw := map[string]int{}
		if err := yaml.UnmarshalStrict(data, &raw); err != nil {
			return cfg, fmt.Errorf("--time-slices-config %s: %w (expected a map of GPU index or UUID to a count, e.g. {\"0\": 4})", o.TimeSlicesConfig, err)
		}
		for k := range raw {
			if _, err := strconv.Atoi(k); err != nil && len(k) < 4 {
				return cfg, fmt.Errorf("--time-slices-config %s: key %q is neither a GPU index nor a UUID", o.TimeSlicesConfig, k)
			}
		}
		cfg.TimeSlicesPerGPU = raw
	}
	return cfg, cfg.Validate()
}

// Validate checks the options needed to run (not to print).
func (o *Options) Validate() error {
	if o.NodeName == "" {
		return fmt.Errorf("--node-name is required (or set NODE_NAME)")
	}
	if o.CDIRoot == "" {
		return fmt.Errorf("--cdi-root must not be empty")
	}
	if o.PluginDataDir == "" {
		return fmt.Errorf("--plugin-data-dir must not be empty")
	}
	for _, f := range []struct{ name, value string }{
		{"--driver-root", o.DriverRoot}, {"--container-driver-root", o.ContainerDriverRoot},
		{"--dev-root", o.DevRoot}, {"--container-dev-root", o.ContainerDevRoot}, {"--nvidia-cdi-hook-path", o.NvidiaCDIHookPath},
	} {
		if f.value != "" && !filepath.IsAbs(f.value) {
			return fmt.Errorf("%s=%q must be an absolute path", f.name, f.value)
		}
	}
	if o.ContainerDriverRoot != "" && o.DriverRoot == "" {
		return fmt.Errorf("--container-driver-root needs --driver-root: say where the driver is on the host")
	}
	if o.RescanInterval < time.Second {
		return fmt.Errorf("--rescan-interval=%s is too short: use at least 1s", o.RescanInterval)
	}
	return nil
}
