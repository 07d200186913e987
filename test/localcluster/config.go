package localcluster

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Fixed addresses. Everything binds to 127.0.0.1, so one cluster per machine.
const (
	// NodeName is the name of the only node (the kubelet refuses a loopback
	// --node-ip, so it runs with --hostname-override=127.0.0.1 and the node is
	// named after its InternalIP). Tests should read it from the API rather
	// than hard-code it.
	NodeName = "127.0.0.1"

	EtcdClientPort        = 2379
	EtcdPeerPort          = 2380
	EtcdMetricsPort       = 2381
	APIServerPort         = 6443
	ControllerManagerPort = 10257
	SchedulerPort         = 10259
	KubeletPort           = 10250
	KubeletHealthzPort    = 10248

	serviceCIDR = "10.0.0.0/24" // an address space only: nothing routes to it
	serviceIP   = "10.0.0.1"

	// KubeletRootDir is fixed because DRA plugins register under it.
	KubeletRootDir = "/var/lib/kubelet"
	// CDIRoot is where DRA plugins write their CDI specs.
	CDIRoot = "/var/run/cdi"
)

// APIServerURL is the API server's address.
var APIServerURL = fmt.Sprintf("https://127.0.0.1:%d", APIServerPort)

func featureGateFlag() string {
	var gates []string
	for _, g := range FeatureGates {
		gates = append(gates, g+"=true")
	}
	return strings.Join(gates, ",")
}

// hostPath is the PATH every component gets (and nothing else of the
// harness's environment).
func (c *Cluster) hostPath() string {
	return "PATH=" + filepath.Dir(c.Bin.Containerd) + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
}

func (c *Cluster) writeContainerdConfig() error {
	d := c.Dirs
	cfg := fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
disabled_plugins = ['io.containerd.nri.v1.nri', 'io.containerd.internal.v1.tracing']

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins.'io.containerd.internal.v1.opt']
  path = %[5]q

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[6]q

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ['/etc/cdi', %[7]q]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %[8]q
        Root = %[9]q
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[10]q]
    conf_dir = %[11]q
    max_conf_num = 1
`, d.ContainerdRoot, d.ContainerdState, d.ContainerdSocket, d.ContainerdSocket+".ttrpc",
		filepath.Join(d.ContainerdRoot, "opt"), BusyboxImage, CDIRoot, c.Bin.Runc, d.RuncRoot, d.CNIBin, d.CNIConf)
	return os.WriteFile(d.ContainerdConfig, []byte(cfg), 0o644)
}

func (c *Cluster) writeCNIConfig() error {
	conf, err := json.MarshalIndent(map[string]any{
		"cniVersion": "1.0.0",
		"name":       "tessera-localcluster",
		"plugins":    []map[string]string{{"type": "loopback"}, {"type": "tessera-noop"}},
	}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.Dirs.CNIConf, "10-tessera.conflist"), conf, 0o644)
}

func (c *Cluster) resolvConf() string { return filepath.Join(c.Dirs.Root, "resolv.conf") }

func (c *Cluster) writeKubeletConfig() error {
	var gates strings.Builder
	for _, g := range FeatureGates {
		fmt.Fprintf(&gates, "  %s: true\n", g)
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %q
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%s
imageServiceEndpoint: unix://%s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
serializeImagePulls: false
seccompDefault: true
clusterDomain: cluster.local
clusterDNS: ["127.0.0.1"]
resolvConf: %q
podLogsDir: %q
featureGates:
%s`, KubeletPort, KubeletHealthzPort, c.pki.caCert, c.Dirs.ContainerdSocket, c.Dirs.ContainerdSocket, c.resolvConf(), c.podLogsDir(), gates.String())
	// seccompDefault: a container without a seccomp profile gets the
	// runtime's default (containerd's refuses new user namespaces), as the
	// chart's sandbox policy is told (localcluster.yaml:
	// admissionPolicies.sandbox.nodesSeccompDefault).
	// Pods resolve names against 127.0.0.1 (where nothing answers) instead
	// of the host's resolvers: nothing in the cluster may dial off the machine.
	// clusterDNS says the same for ClusterFirst pods (without it the kubelet
	// warns MissingClusterDNS on every pod; there is no cluster DNS here).
	if err := os.WriteFile(c.resolvConf(), []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		return err
	}
	return os.WriteFile(c.Dirs.KubeletConfig, []byte(cfg), 0o644)
}
