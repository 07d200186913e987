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
	"k8s.io/component-base/featuregate"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/featuregates"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/node/health"
	"github.com/tessera-dev/tessera/pkg/node/nvmlsource"
)

// The values of --mps-mode.
const (
	MPSInProcess = "inprocess"
	MPSPod       = "pod"
)

// Options are the kubelet plugin's command-line options.
type Options struct {
	NodeName       string
	Kubeconfig     string
	Backend        nvmlsource.Options
	ReservedMemory string
	TimeSlices     int
	// MaxSharesPerGPU caps allocations per non-MIG GPU (0 = no cap).
	MaxSharesPerGPU int
	// TimeSlicesConfig is a YAML file mapping GPU index or UUID to N.
	TimeSlicesConfig string
	MIGMode          string
	// MIGDestroyUnknown destroys MIG instances Tessera did not create at
	// start (dynamic mode).
	MIGDestroyUnknown bool
	// AllowSharedGPUs publishes GPUs that the NVIDIA device plugin or
	// another DRA driver already advertises on this node.
	AllowSharedGPUs bool
	RescanInterval  time.Duration
	CDIRoot         string
	PluginDataDir   string
	RegistrarDir    string
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
	// DisabledCDIHooks are nvidia-cdi-hook hooks left out of every CDI
	// spec (driverfiles.KnownHooks).
	DisabledCDIHooks []string
	PrintSlices      bool
	// MPSPipeDir is where the node's MPS control daemons keep their pipe
	// directories (<dir>/<gpu-uuid> or <dir> for one daemon for all GPUs).
	MPSPipeDir string
	// MinEnforcement is the node's enforcement floor: none, mps or
	// interposer. A share or time slice whose effective enforcement is
	// weaker fails to prepare.
	MinEnforcement string
	// MPSControl is nvidia-cuda-mps-control: when set, the plugin runs one
	// MPS control daemon per claim in mps mode (the mock backend fakes it).
	MPSControl string
	// MPSMode is where the per-claim daemons run: inprocess (children of
	// the plugin) or pod (a Pod per claim, package mpspod).
	MPSMode string
	// MPSDaemonNamespace, MPSDaemonImage, MPSDaemonBinary and
	// MPSDaemonPriorityClass configure the daemon Pods (MPSMode pod).
	MPSDaemonNamespace     string
	MPSDaemonImage         string
	MPSDaemonPullPolicy    string
	MPSDaemonBinary        string
	MPSDaemonPriorityClass string
	// AccountingTmpfs makes each claim's accounting directory a tmpfs;
	// the mounts must reach the container runtime (same mount namespace,
	// or a shared, Bidirectional plugin data directory).
	AccountingTmpfs bool
	// AccountingSize bounds each claim's accounting tmpfs (a quantity).
	AccountingSize string
	accountingSize uint64
	// NvidiaSMI is the nvidia-smi binary that sets GPU time slices.
	NvidiaSMI string
	// HealthIgnoredXIDs are XIDs that do not make a device unhealthy
	// (they give an informational taint, effect None).
	HealthIgnoredXIDs []uint
	// HealthFatalEffect is the effect of the taints of fatal faults:
	// NoSchedule or NoExecute.
	HealthFatalEffect string
	// HealthHoldDown is how long a faulty GPU must answer NVML with no new
	// event of a cause before that cause's taint is cleared; 0 keeps
	// taints until the plugin restarts.
	HealthHoldDown time.Duration
	// PodUID, when set, turns on seamless upgrades: the kubelet plugin
	// library's rolling-update mode, keyed by the plugin pod's UID.
	PodUID string
	// HealthcheckPort serves the gRPC health service for the probes; a
	// negative port serves none.
	HealthcheckPort    int
	HealthcheckAddress string
	// HealthcheckSocket serves the health service on a Unix socket for
	// exec probes; Probe, when set, makes the binary such a probe.
	HealthcheckSocket string
	Probe             string
	// MetricsBindAddress serves /metrics; "" or "0" serves none.
	MetricsBindAddress string
	// UsageInterval is how often GPU usage is sampled; 0 disables it.
	UsageInterval time.Duration
	// HostProcRoot is the host's /proc as the plugin sees it (NVML
	// reports host PIDs).
	HostProcRoot string
	// BootIDPath is where the node's boot ID is read (no flag; tests
	// change it). Empty means /proc/sys/kernel/random/boot_id.
	BootIDPath string

	// Gates are the plugin's feature gates (featuregates.Plugin), set by
	// --feature-gates; nil means their defaults.
	Gates featuregate.FeatureGate

	// crash, when set, is called at named points of prepare and unprepare
	// (crash-injection tests).
	crash func(point string)
}

// AddFlags registers the options. The names are a contract: scripts and the
// Helm chart use them.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "Name of this node; also the pool name. Defaults to $NODE_NAME.")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "Path to a kubeconfig; empty means in-cluster configuration.")
	fs.StringVar(&o.Backend.Kind, "gpu-backend", nvmlsource.NVML, "Where GPUs come from: nvml (the node's NVIDIA driver) or mock (built-in mock GPUs).")
	fs.StringVar(&o.Backend.NVMLLibrary, "nvml-library", "", "Path of libnvidia-ml.so.1 for --gpu-backend=nvml (default: the loader's search path).")
	fs.StringVar(&o.Backend.MockProfile, "mock-profile", "t4:1", "Mock GPUs: <model>[:<count>][,...] with models t4, a10, l4, a100-40gb, a100-80gb, h100-80gb, h200-141gb, b200-180gb, or a node: dgxa100, dgxh100, dgxh200, dgxb200.")
	fs.StringVar(&o.Backend.MockConfig, "mock-config", "", "YAML file describing the mock node (`gpus: [{model: t4, count: 2}]`); overrides --mock-profile.")
	fs.StringVar(&o.Backend.MockMIG, "mock-mig", "none", "Put MIG-capable mock GPUs in MIG mode (no instances created): all or none.")
	fs.StringVar(&o.Backend.MockStateDir, "mock-state-dir", "", "Where mock GPUs keep MIG state across restarts (default: the plugin data directory).")
	fs.StringVar(&o.ReservedMemory, "reserved-memory", "256Mi", "GPU memory held back per GPU for the driver and CUDA contexts; shares and time slices are carved from the rest.")
	fs.IntVar(&o.MaxSharesPerGPU, "max-shares-per-gpu", 0, fmt.Sprintf("Most allocations (shares or exclusive claims) one non-MIG GPU carries, published as the consumable capacity `shares` so that the scheduler enforces it; 0 (no cap) to %d.", devicemodel.MaxSharesPerGPU))
	fs.IntVar(&o.TimeSlices, "time-slices", 0, fmt.Sprintf("Time-slice partitions published per non-MIG GPU (gpu-<i>-ts-<k>), 0 to %d; 0 publishes none.", devicemodel.MaxTimeSlices))
	fs.StringVar(&o.TimeSlicesConfig, "time-slices-config", "", "YAML file overriding --time-slices per GPU, keyed by GPU index or UUID, e.g. `{\"0\": 4, \"1\": 0}`.")
	fs.StringVar(&o.MIGMode, "mig-mode", string(devicemodel.MIGDynamic), "How MIG-enabled GPUs are published: dynamic (every profile x placement, created at prepare) or static (existing instances).")
	fs.BoolVar(&o.MIGDestroyUnknown, "mig-destroy-unknown", false, "With --mig-mode=dynamic, destroy at start the MIG instances on MIG-enabled GPUs that Tessera did not create (no prepared claim owns them). Off: they are left, and the placements they block are not published.")
	fs.BoolVar(&o.AllowSharedGPUs, "allow-shared-gpus", false, "Publish GPUs that this node already advertises through the NVIDIA device plugin (nvidia.com/gpu allocatable) or another DRA driver (same UUID). Off: such GPUs are left out, with a log line and a Warning Event on the Node.")
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
	fs.StringSliceVar(&o.DisabledCDIHooks, "disabled-cdi-hooks", nil, "nvidia-cdi-hook createContainer hooks to leave out of every claim's CDI spec, for images that do not need them (each hook runs at every container start): create-symlinks, update-ldcache, enable-cuda-compat, disable-device-node-modification, update-application-profile. Default: none left out (what the NVIDIA container toolkit generates). docs/enforcement.md#driver-files says what each does.")
	fs.BoolVar(&o.PrintSlices, "print-slices", false, "Print the ResourceSlices this node would publish as YAML and exit; needs no cluster.")
	fs.StringVar(&o.MPSPipeDir, "mps-pipe-dir", "", "Directory of the node's MPS control daemons: a GPU is served when <dir>/<gpu-uuid>/control (one daemon per GPU) or <dir>/control (one for all) exists; mps-mode claims get that pipe directory mounted.")
	fs.StringVar(&o.MinEnforcement, "min-enforcement", "none", "The node's enforcement floor: none, mps or interposer (weakest first). A share or time slice whose effective enforcement is weaker (the claim asked for less, or this node lacks --interposer-library or an MPS daemon) fails to prepare; MIG devices and whole GPUs satisfy every floor. A DeviceClass's GpuConfig.minEnforcement can raise it per class.")
	fs.StringVar(&o.MPSMode, "mps-mode", MPSInProcess, "Where the per-claim MPS control daemons of --mps-control run: inprocess (children of the plugin's process; a plugin restart restarts them) or pod (one Pod per claim in --mps-daemon-namespace, bound to this node, created at prepare and deleted at unprepare; a plugin restart, upgrade or crash leaves it running).")
	fs.StringVar(&o.MPSDaemonNamespace, "mps-daemon-namespace", os.Getenv("POD_NAMESPACE"), "Namespace of the MPS daemon pods (--mps-mode=pod); defaults to $POD_NAMESPACE, the plugin's own.")
	fs.StringVar(&o.MPSDaemonImage, "mps-daemon-image", "", "Image of the MPS daemon pods (--mps-mode=pod): the plugin's own image, whose --mps-daemon-binary runs the daemon.")
	fs.StringVar(&o.MPSDaemonPullPolicy, "mps-daemon-image-pull-policy", "IfNotPresent", "Pull policy of the MPS daemon pods' image: Always, IfNotPresent or Never.")
	fs.StringVar(&o.MPSDaemonBinary, "mps-daemon-binary", "/usr/bin/kubelet-plugin", "The kubelet-plugin binary in --mps-daemon-image.")
	fs.StringVar(&o.MPSDaemonPriorityClass, "mps-daemon-priority-class", "", "PriorityClass of the MPS daemon pods; empty for none.")
	fs.StringVar(&o.MPSControl, "mps-control", "", "Path of nvidia-cuda-mps-control (e.g. /usr/bin/nvidia-cuda-mps-control on the driver root). When set, every claim in mps mode gets its own MPS control daemon, started by the plugin with the claim's limits set on the daemon side, and only that claim's containers mount its pipe directory; --mps-pipe-dir is then not used. With --gpu-backend=mock any value (e.g. fake) selects an in-process fake daemon.")
	fs.BoolVar(&o.AccountingTmpfs, "accounting-tmpfs", true, "Make each claim's accounting directory a size-limited tmpfs (--accounting-size). The mounts must reach the container runtime: run the plugin in the host's mount namespace, or mount --plugin-data-dir with Bidirectional propagation (which needs a shared host mount). False: plain directories without a size limit.")
	fs.StringVar(&o.AccountingSize, "accounting-size", "16Mi", "Size limit of each claim's accounting tmpfs (the interposer's CUDA_DEVICE_MEMORY_SHARED_CACHE directory, <plugin-data-dir>/accounting/<claimUID>). Where the plugin may not mount, plain directories without a limit are used and a warning is logged.")
	fs.StringVar(&o.NvidiaSMI, "nvidia-smi", "nvidia-smi", "nvidia-smi binary used to set GPU time-slice intervals (--gpu-backend=nvml).")
	fs.StringVar(&o.PodUID, "pod-uid", "", "UID of the plugin's own pod (downward API metadata.uid). When set, an old and a new plugin pod serve side by side during an upgrade (the kubelet plugin library's rolling update): kubelet calls are serialized across both through a lock file in --plugin-data-dir and each call reloads the other's prepared claims.")
	fs.IntVar(&o.HealthcheckPort, "healthcheck-port", -1, "Port of the gRPC health service (grpc.health.v1) for liveness, readiness and startup probes; negative serves none.")
	fs.StringVar(&o.HealthcheckSocket, "healthcheck-socket", "", "Unix socket to serve the health service on as well, for exec probes (kubelet-plugin --probe); put it in a directory of the pod's own, e.g. /tmp/health.sock.")
	fs.StringVar(&o.Probe, "probe", "", "Run as a probe instead of a plugin: ask the plugin's health service on --healthcheck-socket about liveness, readiness or startup, exit 0 when it is serving, 1 otherwise.")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", "127.0.0.1:8390", "Address of the Prometheus metrics endpoint (/metrics): per-claim allocated vs used memory, per-GPU memory and health, prepare latency and errors; empty or 0 serves none.")
	fs.DurationVar(&o.UsageInterval, "usage-interval", 10*time.Second, "How often the compute processes on the GPUs are sampled (one NVML pass for all GPUs) and attributed to claims: metrics, and each claim's status.devices usage when it changed noticeably; 0 disables sampling.")
	fs.StringVar(&o.HostProcRoot, "host-proc-root", "/proc", "The host's /proc as the plugin sees it (the chart mounts it at /host/proc): NVML reports host PIDs, mapped to pods through <root>/<pid>/cgroup. With --gpu-backend=mock, host processes that set MOCK_GPU_MEMORY_USED are simulated as compute processes.")
	fs.StringVar(&o.HealthcheckAddress, "healthcheck-address", "", "Address the health service listens on; empty means every address of the pod's network (what the kubelet's gRPC probe dials).")
	var ignored []uint
	for _, x := range health.DefaultIgnoredXIDs {
		ignored = append(ignored, uint(x))
	}
	fs.UintSliceVar(&o.HealthIgnoredXIDs, "health-ignored-xids", ignored, "XID errors caused by applications: they give the informational taint "+health.KeyAppXID+" (effect None) and leave the GPU healthy; any other XID makes it unhealthy.")
	fs.StringVar(&o.HealthFatalEffect, "health-fatal-effect", "NoSchedule", "Effect of the taints of fatal GPU faults (lost GPU, uncorrectable ECC, critical XID): NoSchedule keeps new claims off the device, NoExecute also evicts the pods whose claims use it (unless they tolerate it).")
	fs.DurationVar(&o.HealthHoldDown, "health-recovery-hold-down", health.DefaultHoldDown, "A fault's taint is cleared once the GPU answers NVML and no new event of that cause came for this long; 0 keeps taints until the plugin restarts.")
}

// DeviceModelConfig validates the options that shape the device model.
func (o *Options) DeviceModelConfig() (devicemodel.Config, error) {
	cfg := devicemodel.Config{TimeSlices: o.TimeSlices, MaxSharesPerGPU: o.MaxSharesPerGPU, MIGMode: devicemodel.MIGMode(o.MIGMode)}
	if cfg.MIGMode == devicemodel.MIGDynamic {
		if err := featuregates.Require(o.Gates, featuregates.Plugin(), featuregates.DynamicMIG, "--mig-mode=dynamic (the default; --mig-mode=static does not)"); err != nil {
			return cfg, err
		}
	}
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
	if _, err := health.ParseFatalEffect(o.HealthFatalEffect); err != nil {
		return fmt.Errorf("--health-fatal-effect: %w", err)
	}
	if o.HealthHoldDown < 0 {
		return fmt.Errorf("--health-recovery-hold-down=%s is negative", o.HealthHoldDown)
	}
	if o.HealthcheckPort > 65535 {
		return fmt.Errorf("--healthcheck-port=%d is not a port: use 1-65535, or -1 to serve no health service", o.HealthcheckPort)
	}
	if o.AccountingSize != "" {
		q, err := resource.ParseQuantity(o.AccountingSize)
		if err != nil || q.Sign() <= 0 || q.Value() < 64<<10 {
			return fmt.Errorf("--accounting-size=%q is not a valid size: use a quantity of at least 64Ki, such as 16Mi", o.AccountingSize)
		}
		o.accountingSize = uint64(q.Value())
	}
	if v1alpha1.FloorRank(v1alpha1.EnforcementMode(o.MinEnforcement)) < 0 {
		return fmt.Errorf("--min-enforcement=%s is not supported: use none, mps or interposer", o.MinEnforcement)
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
	if o.MPSControl != "" {
		if err := featuregates.Require(o.Gates, featuregates.Plugin(), featuregates.PerClaimMPS, "--mps-control"); err != nil {
			return err
		}
	}
	switch o.MPSMode {
	case "", MPSInProcess:
	case MPSPod:
		if err := featuregates.Require(o.Gates, featuregates.Plugin(), featuregates.MPSDaemonPods, "--mps-mode=pod"); err != nil {
			return err
		}
		if o.MPSControl == "" {
			return fmt.Errorf("--mps-mode=pod needs --mps-control: the path of nvidia-cuda-mps-control in the daemon pods, or fake with mock GPUs")
		}
		if o.MPSDaemonNamespace == "" || o.MPSDaemonImage == "" {
			return fmt.Errorf("--mps-mode=pod needs --mps-daemon-namespace (or $POD_NAMESPACE) and --mps-daemon-image (the plugin's image)")
		}
		switch o.MPSDaemonPullPolicy {
		case "Always", "IfNotPresent", "Never":
		default:
			return fmt.Errorf("--mps-daemon-image-pull-policy=%s is not supported: use Always, IfNotPresent or Never", o.MPSDaemonPullPolicy)
		}
	default:
		return fmt.Errorf("--mps-mode=%s is not supported: use inprocess or pod", o.MPSMode)
	}
	if o.RescanInterval < time.Second {
		return fmt.Errorf("--rescan-interval=%s is too short: use at least 1s", o.RescanInterval)
	}
	return nil
}
