package localcluster

// Every version the local cluster is built from is pinned here and nowhere else.
// Changing one of these rebuilds only that component: binaries are cached under
// CacheDir()/bin/<component>-<version>/.
const (
	// KubernetesVersion is the k8s.io/kubernetes release whose kube-apiserver,
	// kube-controller-manager, kube-scheduler, kubelet and kubectl are built.
	KubernetesVersion = "v1.37.1"
	// KubernetesStagingVersion is the version of the k8s.io/* staging modules
	// (k8s.io/api, k8s.io/client-go, ...) that belongs to KubernetesVersion.
	KubernetesStagingVersion = "v0.37.1"
	// EtcdVersion is the go.etcd.io/etcd/server/v3 release.
	EtcdVersion = "v3.6.16"
	// ContainerdVersion is the github.com/containerd/containerd/v2 release
	// (containerd, ctr, containerd-shim-runc-v2).
	ContainerdVersion = "v2.2.1"
	// KwokVersion is the sigs.k8s.io/kwok release whose kwok controller
	// simulates nodes for the scale benchmarks (make bench-scale).
	KwokVersion = "v0.8.0"
	// KueueVersion is the sigs.k8s.io/kueue release the scale benchmark
	// compares Tessera's admission with (make bench-scale).
	KueueVersion = "v0.17.0"
)

// HostPackages are the Debian packages the cluster needs on the host; they are
// installed with apt-get when one of their files is missing.
var HostPackages = []HostPackage{
	{Name: "runc", File: "/usr/sbin/runc"},
	{Name: "containernetworking-plugins", File: "/usr/lib/cni/loopback"},
	{Name: "busybox-static", File: "/bin/busybox"},
}

// HostPackage is a Debian package and one file that proves it is installed.
type HostPackage struct {
	Name string
	File string
}

// FeatureGates are passed, identically, to the API server, controller-manager,
// scheduler and kubelet.
var FeatureGates = []string{
	"DRAConsumableCapacity",
	"DRAPartitionableDevices",
	"DRADeviceTaints",
	"DRADeviceTaintRules",
	"DRADeviceBindingConditions",
	"DRAFractionalCapacityRange",
	"GenericWorkload",
	"DRAWorkloadResourceClaims",
}

// RuntimeConfig is the API server's --runtime-config.
const RuntimeConfig = "scheduling.k8s.io/v1beta1=true"
