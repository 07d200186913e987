// Package localcluster runs a real single-node Kubernetes cluster (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, containerd + runc
// and one kubelet) as host processes on 127.0.0.1, built from pinned upstream
// versions, for Tessera's demo and end-to-end tests. See docs/local-cluster.md.
package localcluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tessera-dev/tessera/test/testutil"
)

// DriverName is the DRA driver the Tessera kubelet plugin registers.
const DriverName = "gpu.tessera.dev"

// DefaultProfile is the mock GPU profile the kubelet plugin starts with.
const DefaultProfile = "t4:2"

// PluginMode says whether Up starts the Tessera kubelet plugin.
type PluginMode string

const (
	// PluginAuto starts the plugin when ./cmd/kubelet-plugin has Go sources.
	PluginAuto PluginMode = "auto"
	PluginOn   PluginMode = "on"
	PluginOff  PluginMode = "off"
)

// Options configure a cluster. The zero value is usable.
type Options struct {
	// WorkDir holds everything of the cluster except the kubelet's root
	// directory. Default: $TESSERA_CLUSTER_DIR or /var/lib/tessera-localcluster.
	WorkDir string
	// RepoRoot is the Tessera checkout (for building its commands).
	// Default: found by walking up from the current directory.
	RepoRoot string
	// Install says how Tessera's plugin and controller run: InstallChart
	// (the Helm chart, with an image built and imported without Docker) or
	// InstallHost (host processes). Default: DefaultInstallMode().
	Install InstallMode
	// Plugin says whether to start the Tessera kubelet plugin. Default auto.
	Plugin PluginMode
	// Profile is the plugin's --mock-profile. Default DefaultProfile.
	Profile string
	// PluginArgs are appended to the plugin's command line (in chart mode:
	// mapped to chart values, see PluginValues).
	PluginArgs []string
	// Controller starts Tessera's controller (off by default): in chart
	// mode controller.enabled in the release, in host mode ./cmd/controller
	// as a host process.
	Controller bool
	// ControllerArgs are appended to the controller's command line (in
	// chart mode: controller.extraArgs).
	ControllerArgs []string
	// ComponentArgs are appended to an upstream component's command line,
	// by component name (kube-apiserver, kube-controller-manager,
	// kube-scheduler, kubelet): the scale benchmarks lift client rate limits
	// as kwokctl's --disable-qps-limits does.
	ComponentArgs map[string][]string
	// ChartValues are merged over the harness's own chart values (chart
	// mode), e.g. {"controller": {"logVerbosity": 2}}.
	ChartValues map[string]any
	// KeepOnFailure leaves a cluster that failed to come up running for
	// inspection instead of tearing it down.
	KeepOnFailure bool
	// Logf reports progress. Default: stderr.
	Logf Logf
}

// Dirs are the paths of one cluster.
type Dirs struct {
	Root             string
	Pids             string
	Logs             string
	Archive          string
	PKI              string
	Kubeconfigs      string
	Etcd             string
	ContainerdRoot   string
	ContainerdState  string
	ContainerdSocket string
	ContainerdConfig string
	RuncRoot         string
	CNIBin           string
	CNIConf          string
	Bin              string
	Images           string
	MockDevices      string
	// DriverRoot is the fixture driver root (pkg/node/driverfiles/fixture) the
	// chart-installed plugin gives every claim's containers.
	DriverRoot    string
	KubeletConfig string
}

// Cluster is a handle on the local cluster in a work directory.
type Cluster struct {
	Opts Options
	Dirs Dirs
	Bin  *Binaries
	// Kubeconfig is the admin kubeconfig (system:masters).
	Kubeconfig string
	// Client is an admin clientset; set once the API server is up.
	Client kubernetes.Interface

	pki    *pki
	logf   Logf
	mu     sync.Mutex
	exited map[string]chan struct{}
	plugin PluginConfig
	// expected are the devices the running plugin configuration publishes.
	expected []string
	downMu   sync.Mutex
	// The fixture driver root, built once (ensureDriverRoot).
	driverRootOnce sync.Once
	driverRootErr  error
	// Chart mode: the helm binary, the image built for this cluster and
	// what was installed.
	helm  string
	image *builtImage
	chart chartState
	// previousChart is what the install before chart installed: RollbackChart
	// restores it.
	previousChart chartState
}

// Component names; also the names of their pid and log files.
const (
	compEtcd       = "etcd"
	compContainerd = "containerd"
	compAPIServer  = "kube-apiserver"
	compCM         = "kube-controller-manager"
	compScheduler  = "kube-scheduler"
	compKubelet    = "kubelet"
	compPlugin     = "tessera-kubelet-plugin"
	compController = "tessera-controller"
)

// DefaultWorkDir is $TESSERA_CLUSTER_DIR or /var/lib/tessera-localcluster.
func DefaultWorkDir() string {
	if d := os.Getenv("TESSERA_CLUSTER_DIR"); d != "" {
		return d
	}
	return "/var/lib/tessera-localcluster"
}

// New returns a handle on the cluster described by opts without starting or
// building anything; Down and Status work on it.
func New(opts Options) (*Cluster, error) {
	if opts.WorkDir == "" {
		opts.WorkDir = DefaultWorkDir()
	}
	if !filepath.IsAbs(opts.WorkDir) {
		abs, err := filepath.Abs(opts.WorkDir)
		if err != nil {
			return nil, err
		}
		opts.WorkDir = abs
	}
	if opts.Plugin == "" {
		opts.Plugin = PluginAuto
	}
	if opts.Install == "" {
		opts.Install = DefaultInstallMode()
	}
	if opts.Install != InstallChart && opts.Install != InstallHost {
		return nil, fmt.Errorf("install mode %q: use %s or %s (TESSERA_INSTALL)", opts.Install, InstallChart, InstallHost)
	}
	if opts.Profile == "" {
		opts.Profile = DefaultProfile
	}
	if opts.Logf == nil {
		opts.Logf = func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, "[localcluster %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
		}
	}
	if opts.RepoRoot == "" {
		// Only bring-up needs the repository (to build Tessera's commands);
		// Down and Status work from anywhere.
		opts.RepoRoot, _ = testutil.RepoRoot()
	}
	r := opts.WorkDir
	c := &Cluster{
		Opts: opts,
		Dirs: Dirs{
			Root:             r,
			Pids:             filepath.Join(r, "pids"),
			Logs:             filepath.Join(r, "logs"),
			Archive:          filepath.Join(r, "archive"),
			PKI:              filepath.Join(r, "pki"),
			Kubeconfigs:      filepath.Join(r, "kubeconfig"),
			Etcd:             filepath.Join(r, "etcd"),
			ContainerdRoot:   filepath.Join(r, "containerd", "root"),
			ContainerdState:  filepath.Join(r, "containerd", "state"),
			ContainerdSocket: filepath.Join(r, "containerd", "containerd.sock"),
			ContainerdConfig: filepath.Join(r, "containerd", "config.toml"),
			RuncRoot:         filepath.Join(r, "containerd", "runc"),
			CNIBin:           filepath.Join(r, "cni", "bin"),
			CNIConf:          filepath.Join(r, "cni", "conf"),
			Bin:              filepath.Join(r, "bin"),
			Images:           filepath.Join(r, "images"),
			MockDevices:      filepath.Join(r, "mock-devices"),
			DriverRoot:       filepath.Join(r, "driver-root"),
			KubeletConfig:    filepath.Join(r, "kubelet-config.yaml"),
		},
		Bin:        binaryPaths(),
		Kubeconfig: filepath.Join(r, "kubeconfig", adminIdentity.name+".kubeconfig"),
		logf:       opts.Logf,
		exited:     map[string]chan struct{}{},
	}
	return c, nil
}

// Up tears down whatever a previous run left, builds what is missing, and
// brings the cluster up: etcd, containerd (with the busybox image imported),
// kube-apiserver, kube-controller-manager, kube-scheduler and the kubelet,
// then the Tessera kubelet plugin (see Options.Plugin) and, when asked, the
// controller, as host processes or through the Helm chart (Options.Install).
// It returns once the API server is ready, the node is Ready, the
// default ServiceAccount exists and the plugin (if started) is registered and
// has published its ResourceSlice. On failure it archives the logs and tears
// everything down again (unless KeepOnFailure).
func Up(ctx context.Context, opts Options) (*Cluster, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the local cluster runs a kubelet and containerd and needs root")
	}
	c, err := New(opts)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := c.claimOwnership(ctx); err != nil {
		return nil, err
	}
	if err := c.Down(); err != nil {
		// What a previous run left is gone even so (teardown goes on past
		// errors); whatever still stands in the way fails the bring-up below.
		c.logf("teardown before bring-up reported: %v", err)
	}
	if err := c.up(ctx); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (interrupted: %v)", err, context.Cause(ctx))
		}
		if dir, aerr := c.ArchiveLogs("failed-up"); aerr == nil {
			c.logf("bring-up failed; logs archived in %s", dir)
		}
		if !opts.KeepOnFailure {
			if derr := c.Down(); derr != nil {
				c.logf("teardown after failed bring-up: %v", derr)
			}
		}
		return nil, err
	}
	c.logf("cluster up in %s (kubeconfig %s)", time.Since(start).Round(100*time.Millisecond), c.Kubeconfig)
	return c, nil
}

func (c *Cluster) up(ctx context.Context) error {
	if c.Opts.RepoRoot == "" {
		return errors.New("cannot find the Tessera repository (go.mod of github.com/tessera-dev/tessera) above the working directory; set Options.RepoRoot")
	}
	b, err := EnsureBinaries(ctx, c.logf)
	if err != nil {
		return err
	}
	c.Bin = b
	if c.ChartMode() {
		if _, err := c.helmBinary(ctx); err != nil {
			return err
		}
	}
	d := c.Dirs
	for _, dir := range []string{d.Pids, d.Logs, d.Archive, d.Etcd, d.ContainerdRoot, d.ContainerdState, d.RuncRoot,
		d.CNIBin, d.CNIConf, d.Bin, d.Images, d.MockDevices, c.podLogsDir(), KubeletRootDir, CDIRoot} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	_ = os.Chmod(d.Etcd, 0o700) // etcd insists
	// Fresh logs for a fresh cluster; older runs live in the archive.
	if entries, err := os.ReadDir(d.Logs); err == nil {
		for _, e := range entries {
			_ = os.Remove(filepath.Join(d.Logs, e.Name()))
		}
	}
	if c.pki, err = makePKI(d.PKI, d.Kubeconfigs, APIServerURL); err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	if err := c.goBuild(ctx, filepath.Join(d.CNIBin, "tessera-noop"), "./test/localcluster/noopcni"); err != nil {
		return err
	}
	if err := os.Symlink(c.Bin.CNILoopback, filepath.Join(d.CNIBin, "loopback")); err != nil {
		return err
	}
	if err := c.writeCNIConfig(); err != nil {
		return err
	}
	if err := c.writeContainerdConfig(); err != nil {
		return err
	}
	if err := c.writeKubeletConfig(); err != nil {
		return err
	}
	imageTar := filepath.Join(d.Images, "busybox.tar")
	if err := writeBusyboxImage(c.Bin.Busybox, imageTar); err != nil {
		return fmt.Errorf("busybox image: %w", err)
	}
	if c.chartWanted() {
		// Before anything runs: on a cold Go build cache this takes minutes.
		if _, err := c.ensureImage(ctx); err != nil {
			return err
		}
	}

	if err := checkPortsFree(); err != nil {
		return err
	}
	env := []string{c.hostPath()}
	if err := c.start(compEtcd, c.Bin.Etcd, []string{
		"--name=default",
		"--data-dir=" + d.Etcd,
		fmt.Sprintf("--listen-client-urls=http://127.0.0.1:%d", EtcdClientPort),
		fmt.Sprintf("--advertise-client-urls=http://127.0.0.1:%d", EtcdClientPort),
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", EtcdPeerPort),
		fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", EtcdPeerPort),
		fmt.Sprintf("--initial-cluster=default=http://127.0.0.1:%d", EtcdPeerPort),
		fmt.Sprintf("--listen-metrics-urls=http://127.0.0.1:%d", EtcdMetricsPort),
		"--unsafe-no-fsync", // a throwaway cluster: durability is not worth the latency
		"--log-level=warn",
	}, env); err != nil {
		return err
	}
	if err := c.start(compContainerd, c.Bin.Containerd, []string{"--config=" + d.ContainerdConfig}, env); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "etcd healthy", 60*time.Second, []string{compEtcd}, func() (bool, error) {
		body, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/health", EtcdClientPort), nil)
		return err == nil && strings.Contains(body, `"health":"true"`), nil
	}); err != nil {
		return err
	}
	if err := c.start(compAPIServer, c.Bin.KubeAPIServer, c.args([]string{
		"--etcd-servers=" + fmt.Sprintf("http://127.0.0.1:%d", EtcdClientPort),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", APIServerPort),
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + filepath.Join(d.PKI, "apiserver-generated"),
		"--tls-cert-file=" + c.pki.apiserverCert,
		"--tls-private-key-file=" + c.pki.apiKey,
		"--client-ca-file=" + c.pki.caCert,
		"--kubelet-client-certificate=" + c.pki.kubeletClientCert,
		"--kubelet-client-key=" + c.pki.kubeletClientKey,
		"--kubelet-preferred-address-types=InternalIP",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + c.pki.saPub,
		"--service-account-signing-key-file=" + c.pki.saKey,
		"--service-cluster-ip-range=" + serviceCIDR,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--runtime-config=" + RuntimeConfig,
		"--feature-gates=" + featureGateFlag(),
		"--v=1",
	}, compAPIServer), env); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "containerd socket", 60*time.Second, []string{compContainerd}, func() (bool, error) {
		_, err := c.ctr(ctx, "version")
		return err == nil, nil
	}); err != nil {
		return err
	}
	c.logf("importing %s into containerd (no registry involved)", BusyboxImage)
	if out, err := c.ctr(ctx, "-n", "k8s.io", "images", "import", "--snapshotter", "overlayfs", imageTar); err != nil {
		return fmt.Errorf("importing busybox image: %w\n%s", err, out)
	}
	if ok, err := c.ImagePresent(ctx, BusyboxImage); err != nil || !ok {
		return fmt.Errorf("image %s not in containerd after import (err %v)", BusyboxImage, err)
	}
	if c.chartWanted() {
		if _, err := c.ensureImage(ctx); err != nil { // imports it
			return err
		}
	}
	if err := c.connect(); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "API server /readyz", 90*time.Second, []string{compAPIServer, compEtcd}, func() (bool, error) {
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && strings.TrimSpace(string(body)) == "ok", nil
	}); err != nil {
		return err
	}
	kc := func(id identity) string { return filepath.Join(d.Kubeconfigs, id.name+".kubeconfig") }
	if err := c.start(compCM, c.Bin.KubeControllerManager, c.args([]string{
		"--kubeconfig=" + kc(cmIdentity),
		"--authentication-kubeconfig=" + kc(cmIdentity),
		"--authorization-kubeconfig=" + kc(cmIdentity),
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", ControllerManagerPort),
		"--cert-dir=" + filepath.Join(d.PKI, "controller-manager-generated"),
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + c.pki.saKey,
		"--root-ca-file=" + c.pki.caCert,
		"--cluster-signing-cert-file=" + c.pki.caCert,
		"--cluster-signing-key-file=" + c.pki.caKey,
		"--leader-elect=false",
		"--feature-gates=" + featureGateFlag(),
		"--v=1",
	}, compCM), env); err != nil {
		return err
	}
	if err := c.start(compScheduler, c.Bin.KubeScheduler, c.schedulerArgs(nil), env); err != nil {
		return err
	}
	if err := c.recordHostState(); err != nil {
		return err
	}
	if err := c.start(compKubelet, c.Bin.Kubelet, c.args([]string{
		"--config=" + d.KubeletConfig,
		"--kubeconfig=" + kc(kubeletIdentity),
		"--hostname-override=" + NodeName,
		"--root-dir=" + KubeletRootDir,
		"--v=2", // DRA plugin registration ("Connection changed") is logged at 2
	}, compKubelet), env); err != nil {
		return err
	}
	core := []string{compEtcd, compContainerd, compAPIServer, compCM, compScheduler, compKubelet}
	for _, hc := range []struct {
		name string
		port int
	}{{compScheduler, SchedulerPort}, {compCM, ControllerManagerPort}} {
		url := fmt.Sprintf("https://127.0.0.1:%d/healthz", hc.port)
		if err := c.waitFor(ctx, hc.name+" /healthz", 60*time.Second, core, func() (bool, error) {
			body, err := httpGet(url, &tls.Config{InsecureSkipVerify: true}) // self-signed, loopback only
			return err == nil && body == "ok", nil
		}); err != nil {
			return err
		}
	}
	if err := c.waitFor(ctx, "node "+NodeName+" Ready", 90*time.Second, core, func() (bool, error) {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	}); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "ServiceAccount default/default", 60*time.Second, core, func() (bool, error) {
		_, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, nil
	}); err != nil {
		return err
	}
	if err := c.applyDeviceClasses(ctx); err != nil {
		return err
	}
	if c.ChartMode() && c.Opts.Controller {
		// One install for both.
		c.mu.Lock()
		c.chart.controller = true
		c.mu.Unlock()
	}
	if c.pluginWanted() {
		if err := c.StartPluginWith(ctx, PluginConfig{Profile: c.Opts.Profile}); err != nil {
			return err
		}
	} else {
		if c.Opts.Plugin == PluginOff {
			c.logf("Tessera's kubelet plugin is not started with the cluster (the caller starts it with the configuration it needs)")
		} else {
			c.logf("not starting Tessera's kubelet plugin: ./cmd/kubelet-plugin has no Go sources")
		}
	}
	if c.Opts.Controller {
		if err := c.StartController(ctx); err != nil {
			return err
		}
	}
	return nil
}

// args appends Options.ComponentArgs of component to its own arguments.
func (c *Cluster) args(own []string, component string) []string {
	return append(own, c.Opts.ComponentArgs[component]...)
}

// connect makes the admin clientset.
func (c *Cluster) connect() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 50, 100
	c.Client, err = kubernetes.NewForConfig(cfg)
	return err
}

// waitFor polls check until it reports true, the timeout passes, ctx ends or
// one of the components in alive exits.
func (c *Cluster) waitFor(ctx context.Context, what string, timeout time.Duration, alive []string, check func() (bool, error)) error {
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		ok, err := check()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			c.logf("%s (%s)", what, time.Since(start).Round(10*time.Millisecond))
			return nil
		}
		if err := c.checkAlive(alive...); err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// checkPortsFree fails when a fixed port is taken by a process that is not
// this cluster's (teardown has already stopped ours).
func checkPortsFree() error {
	var busy []string
	for _, p := range []int{EtcdClientPort, EtcdPeerPort, EtcdMetricsPort, APIServerPort,
		ControllerManagerPort, SchedulerPort, KubeletPort, KubeletHealthzPort} {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			busy = append(busy, fmt.Sprint(p))
			continue
		}
		l.Close()
	}
	if len(busy) > 0 {
		return fmt.Errorf("127.0.0.1 ports %s are in use by processes that are not this cluster's (another cluster on this machine? see `ss -ltnp`)", strings.Join(busy, ", "))
	}
	return nil
}

// httpGet GETs url (3 s timeout, no proxy) and returns the body; a status
// other than 200 is an error, with the body.
func httpGet(url string, tlsConfig *tls.Config) (string, error) {
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig, Proxy: nil}}
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(b), err
}

// Kubectl runs the cluster's own kubectl (never one from PATH) with the
// admin kubeconfig and returns its combined output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.Bin.Kubectl, append([]string{"--kubeconfig=" + c.Kubeconfig}, args...)...)
	cmd.Env = []string{c.hostPath(), "HOME=" + c.Dirs.Root}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}
