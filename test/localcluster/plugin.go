package localcluster

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/test/imagebuild"
)

// DeviceClassesFile is applied after the API server is ready when it exists.
const DeviceClassesFile = "deployments/deviceclasses.yaml"

func (c *Cluster) pluginWanted() bool {
	switch c.Opts.Plugin {
	case PluginOn:
		return true
	case PluginOff:
		return false
	default:
		return imagebuild.HasGoSources(filepath.Join(c.Opts.RepoRoot, "cmd/kubelet-plugin"))
	}
}

// applyDeviceClasses applies DeviceClassesFile in host mode. In chart mode
// the chart owns the DeviceClasses (Helm refuses to adopt objects it did not
// create), so nothing is applied here.
func (c *Cluster) applyDeviceClasses(ctx context.Context) error {
	if c.ChartMode() {
		c.logf("DeviceClasses come with the chart (install mode %s)", c.Opts.Install)
		return nil
	}
	path := filepath.Join(c.Opts.RepoRoot, DeviceClassesFile)
	if _, err := os.Stat(path); err != nil {
		c.logf("no %s yet; no DeviceClasses applied", DeviceClassesFile)
		return nil
	}
	out, err := c.Kubectl(ctx, "apply", "-f", path)
	if err != nil {
		return err
	}
	c.logf("applied %s: %s", DeviceClassesFile, strings.TrimSpace(out))
	return nil
}

// PluginBinary is where the kubelet plugin is built.
func (c *Cluster) PluginBinary() string { return filepath.Join(c.Dirs.Bin, compPlugin) }

// PluginArgs is the kubelet plugin's command line (without the binary) for a
// mock profile such as "t4:2".
func (c *Cluster) PluginArgs(profile string) []string {
	return append([]string{
		"--node-name=" + NodeName,
		"--kubeconfig=" + c.Kubeconfig,
		"--gpu-backend=mock",
		"--mock-profile=" + profile,
		"--cdi-root=" + CDIRoot,
		"--plugin-data-dir=" + filepath.Join(KubeletRootDir, "plugins", DriverName),
		"--registrar-dir=" + filepath.Join(KubeletRootDir, "plugins_registry"),
		"--mock-device-root=" + c.Dirs.MockDevices,
		"-v=4",
	}, c.Opts.PluginArgs...)
}

// PluginConfig is how the kubelet plugin runs: a mock GPU profile and flags
// appended to the command line after Options.PluginArgs (later flags win),
// e.g. {Profile: "t4:2", Args: []string{"--time-slices=4"}} or
// {Profile: "h100-80gb", Args: []string{"--mock-mig=all"}}.
type PluginConfig struct {
	Profile string
	Args    []string
}

func (p PluginConfig) String() string {
	return strings.Join(append([]string{"--mock-profile=" + p.Profile}, p.Args...), " ")
}

// Equal tells whether two configurations run the same plugin.
func (p PluginConfig) Equal(o PluginConfig) bool {
	return p.Profile == o.Profile && slices.Equal(p.Args, o.Args)
}

// StartPlugin builds ./cmd/kubelet-plugin and runs it as a host process with
// the given mock profile; see StartPluginWith.
func (c *Cluster) StartPlugin(ctx context.Context, profile string) error {
	return c.StartPluginWith(ctx, PluginConfig{Profile: profile})
}

// StartPluginWith (re)starts the kubelet plugin with cfg and returns once
// the kubelet has registered the driver (its log says "Connection changed"
// for DriverName with connected=true, after this start) and the driver's
// ResourceSlices for this node carry exactly the devices this configuration
// publishes (read from the plugin's own --print-slices), so that a stale
// slice of an earlier configuration never counts as ready.
//
// In host mode it stops a running instance (SIGTERM), builds
// ./cmd/kubelet-plugin and starts it as a host process. In chart mode
// (Options.Install) it runs `helm upgrade --install` with the configuration
// as chart values (see PluginValues) and a new StartAnnotation, so the
// DaemonSet rolls its pod even when nothing else changed; the expected
// devices come from the image's plugin binary run with the DaemonSet's own
// arguments.
//
// Claims prepared by an earlier instance stay prepared; delete their pods
// first (and wait for their CDI specs to go, see WaitClaimsUnprepared) when
// the device set changes.
func (c *Cluster) StartPluginWith(ctx context.Context, cfg PluginConfig) error {
	if cfg.Profile == "" {
		cfg.Profile = DefaultProfile
	}
	if c.ChartMode() {
		return c.startPluginChart(ctx, cfg, true)
	}
	if err := c.StopPlugin(); err != nil {
		return err
	}
	c.logf("building ./cmd/kubelet-plugin")
	if err := c.goBuild(ctx, c.PluginBinary(), "./cmd/kubelet-plugin"); err != nil {
		return err
	}
	if err := os.MkdirAll(c.Dirs.MockDevices, 0o755); err != nil {
		return err
	}
	args := c.pluginArgs(cfg)
	want, err := c.expectedDevices(ctx, args)
	if err != nil {
		c.logf("cannot tell which devices %s publishes (%v); waiting only for a ResourceSlice", cfg, err)
	}
	// Only registrations logged after this point count: a stale one from an
	// earlier plugin instance must not.
	offset := fileSize(c.LogPath(compKubelet))
	if err := c.start(compPlugin, c.PluginBinary(), args, []string{c.hostPath()}); err != nil {
		return err
	}
	c.mu.Lock()
	c.plugin = cfg
	c.expected = want
	c.mu.Unlock()
	alive := []string{compPlugin, compKubelet, compAPIServer}
	if err := c.waitFor(ctx, "kubelet registered "+DriverName, 60*time.Second, alive, func() (bool, error) {
		return kubeletLogShowsConnected(c.LogPath(compKubelet), offset), nil
	}); err != nil {
		return err
	}
	return c.waitDevices(ctx, cfg, want, alive)
}

// UpgradePlugin changes the configuration of the chart's kubelet plugin
// with a plain `helm upgrade` (chart mode only): unlike StartPluginWith it
// does not force a restart, so the DaemonSet replaces its pod only when the
// rendered pod template changed. It returns once the new pod runs, the
// kubelet registered the driver after the upgrade and the published devices
// are those of cfg.
func (c *Cluster) UpgradePlugin(ctx context.Context, cfg PluginConfig) error {
	if !c.ChartMode() {
		return fmt.Errorf("UpgradePlugin needs install mode %s (this cluster: %s)", InstallChart, c.Opts.Install)
	}
	if cfg.Profile == "" {
		cfg.Profile = DefaultProfile
	}
	return c.startPluginChart(ctx, cfg, false)
}

// Plugin is the configuration the kubelet plugin was last started with by
// this Cluster value (zero before).
func (c *Cluster) Plugin() PluginConfig {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.plugin
}

// pluginArgs is the plugin's full command line for cfg.
func (c *Cluster) pluginArgs(cfg PluginConfig) []string {
	return append(c.PluginArgs(cfg.Profile), cfg.Args...)
}

// expectedDevices runs the built plugin with --print-slices and returns the
// sorted names of the devices it would publish.
func (c *Cluster) expectedDevices(ctx context.Context, args []string) ([]string, error) {
	return c.printSlicesDevices(ctx, c.PluginBinary(), args)
}

// printSlicesDevices runs a plugin binary on the host with args plus
// --print-slices and returns the sorted names of the devices it would
// publish.
func (c *Cluster) printSlicesDevices(ctx context.Context, bin string, args []string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(slices.Clone(args), "--print-slices")...)
	cmd.Env = []string{c.hostPath()}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var names []string
	for _, doc := range strings.Split(string(out), "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var s resourceapi.ResourceSlice
		if err := yaml.Unmarshal([]byte(doc), &s); err != nil {
			return nil, fmt.Errorf("--print-slices output: %w", err)
		}
		for _, d := range s.Spec.Devices {
			names = append(names, d.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// PublishedDevices returns the sorted names of the devices the driver
// publishes for this node: those of the newest pool generation, once all
// slices of that generation exist; nil while it has published nothing or a
// generation is incomplete.
func (c *Cluster) PublishedDevices(ctx context.Context) ([]string, error) {
	list, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var newest int64 = -1
	for _, s := range list.Items {
		if s.Spec.Driver == DriverName && s.Spec.NodeName != nil && *s.Spec.NodeName == NodeName && s.Spec.Pool.Generation > newest {
			newest = s.Spec.Pool.Generation
		}
	}
	if newest < 0 {
		return nil, nil
	}
	var (
		names []string
		count int64
		want  int64
	)
	for _, s := range list.Items {
		if s.Spec.Driver != DriverName || s.Spec.NodeName == nil || *s.Spec.NodeName != NodeName || s.Spec.Pool.Generation != newest {
			continue
		}
		count++
		want = s.Spec.Pool.ResourceSliceCount
		for _, d := range s.Spec.Devices {
			names = append(names, d.Name)
		}
	}
	if count != want {
		return nil, nil
	}
	slices.Sort(names)
	if names == nil {
		names = []string{}
	}
	return names, nil
}

// KillPlugin ends the kubelet plugin with SIGKILL, without a chance to clean
// up: what a crash or an OOM kill does.
//
// In host mode the plugin is then gone; restart it with StartPluginWith
// (for example with c.Plugin()). In chart mode the process of the plugin's
// container (found through containerd from the container ID the pod
// reports, and signalled by PID) is killed and KillPlugin waits until the
// kubelet has restarted the container, the kubelet registered the driver
// again and the published devices are the configuration's.
func (c *Cluster) KillPlugin() error {
	if c.ChartMode() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		return c.killPluginChart(ctx)
	}
	pid, exe, err := readPidFile(c.pidFile(compPlugin))
	if err != nil {
		return fmt.Errorf("%s: %w", compPlugin, err)
	}
	if !procAlive(pid, exe) {
		return fmt.Errorf("%s (pid %d) is not running", compPlugin, pid)
	}
	c.logf("killing %s (pid %d) with SIGKILL", compPlugin, pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if !procAlive(pid, exe) {
			return nil
		}
	}
	return fmt.Errorf("%s (pid %d) survived SIGKILL", compPlugin, pid)
}

// TesseraCDISpecs lists the CDI spec files of Tessera's plugin in CDIRoot.
func TesseraCDISpecs() []string { return tesseraCDISpecs() }

// WaitClaimsUnprepared waits until no CDI spec of Tessera's plugin is left
// in CDIRoot (every claim unprepared), for up to timeout.
func (c *Cluster) WaitClaimsUnprepared(ctx context.Context, timeout time.Duration) error {
	return c.waitFor(ctx, "no Tessera CDI spec left (claims unprepared)", timeout, nil, func() (bool, error) {
		return len(tesseraCDISpecs()) == 0, nil
	})
}

// StopPlugin stops the kubelet plugin if it runs as a host process. Claims
// it prepared stay prepared; delete their pods first to have them
// unprepared. (In chart mode the plugin's pod goes at teardown, after every
// other pod.)
func (c *Cluster) StopPlugin() error { return c.stop(compPlugin, 15*time.Second) }

// CRDsDir holds the CustomResourceDefinitions (the Queue) that host mode
// applies before it starts the controller; in chart mode the chart installs
// its copy (deployments/helm/tessera/crds).
const CRDsDir = "deployments/crds"

// ControllerFeatureGates are the controller's alpha gates a host-mode
// controller runs with: the policies the end-to-end tests exercise
// (TestTimeBasedFairShare, TestIdleReclaim). In chart mode
// deployments/helm/values/localcluster.yaml sets the same
// (controller.featureGates); the canary and the shadow controller and the
// MPS daemon pods run in chart mode only, where the chart sets their gates.
const ControllerFeatureGates = "IdleReclaim=true,TimeBasedFairShare=true"

// StartController starts Tessera's controller and waits until it is ready.
//
// In host mode it applies CRDsDir, builds ./cmd/controller and runs it as
// a host process (`--kubeconfig=<admin> -v=4 --feature-gates=<ControllerFeatureGates>`
// plus Options.ControllerArgs);
// readiness is only that it is still running after two seconds. In chart
// mode it enables the controller in the release (`helm upgrade`, which
// leaves the plugin's pod alone) and waits until the Deployment is
// available and the webhook configurations carry the controller's CA.
func (c *Cluster) StartController(ctx context.Context) error {
	if c.ChartMode() {
		return c.startControllerChart(ctx)
	}
	if err := c.stop(compController, 15*time.Second); err != nil {
		return err
	}
	if err := c.applyCRDs(ctx); err != nil {
		return err
	}
	bin := filepath.Join(c.Dirs.Bin, compController)
	c.logf("building ./cmd/controller")
	if err := c.goBuild(ctx, bin, "./cmd/controller"); err != nil {
		return err
	}
	args := append([]string{"--kubeconfig=" + c.Kubeconfig, "-v=4", "--feature-gates=" + ControllerFeatureGates}, c.Opts.ControllerArgs...)
	if err := c.start(compController, bin, args, []string{c.hostPath()}); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(2 * time.Second):
	}
	return c.checkAlive(compController)
}

// applyCRDs applies CRDsDir (server-side: the CRDs are too large for the
// last-applied annotation) and waits until they are established.
func (c *Cluster) applyCRDs(ctx context.Context) error {
	dir := filepath.Join(c.Opts.RepoRoot, CRDsDir)
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if len(files) == 0 {
		return nil
	}
	out, err := c.Kubectl(ctx, "apply", "--server-side", "--force-conflicts", "-f", dir)
	if err != nil {
		return err
	}
	c.logf("applied %s: %s", CRDsDir, strings.Join(strings.Fields(out), " "))
	_, err = c.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s", "-f", dir)
	return err
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// kubeletLogShowsConnected scans the kubelet log from offset for the DRA
// plugin manager's registration line of DriverName.
func kubeletLogShowsConnected(path string, offset int64) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if _, err := f.Seek(offset, 0); err != nil {
		return false
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, `"Connection changed"`) && strings.Contains(l, fmt.Sprintf("%q", DriverName)) && strings.Contains(l, "connected=true") {
			return true
		}
	}
	return false
}

// PluginRunning tells whether the Tessera kubelet plugin runs: its host
// process, or in chart mode the container of the DaemonSet's pod.
func (c *Cluster) PluginRunning() bool {
	if c.ChartMode() {
		return c.chartPluginRunning(context.Background())
	}
	return c.running(compPlugin)
}

// waitDevices waits until the plugin publishes want, the devices of cfg
// (any ResourceSlice of the driver on the node when want is nil), failing
// when one of the processes in alive exits.
func (c *Cluster) waitDevices(ctx context.Context, cfg PluginConfig, want []string, alive []string) error {
	what := "ResourceSlice of " + DriverName + " on " + NodeName
	if want != nil {
		what = fmt.Sprintf("ResourceSlices of %s on %s with the %d devices of %s", DriverName, NodeName, len(want), cfg)
	}
	return c.waitFor(ctx, what, 60*time.Second, alive, func() (bool, error) {
		got, err := c.PublishedDevices(ctx)
		if err != nil || got == nil {
			return false, nil
		}
		return want == nil || slices.Equal(got, want), nil
	})
}
