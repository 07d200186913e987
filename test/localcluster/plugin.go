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
)

// DeviceClassesFile is applied after the API server is ready when it exists.
const DeviceClassesFile = "deployments/deviceclasses.yaml"

// hasGoSources tells whether a repository directory holds a non-test Go file.
func (c *Cluster) hasGoSources(dir string) bool {
	matches, _ := filepath.Glob(filepath.Join(c.Opts.RepoRoot, dir, "*.go"))
	for _, m := range matches {
		if !strings.HasSuffix(m, "_test.go") {
			return true
		}
	}
	return false
}

func (c *Cluster) pluginWanted() bool {
	switch c.Opts.Plugin {
	case PluginOn:
		return true
	case PluginOff:
		return false
	default:
		return c.hasGoSources("cmd/kubelet-plugin")
	}
}

func (c *Cluster) applyDeviceClasses(ctx context.Context) error {
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

// StartPluginWith (re)starts the kubelet plugin with cfg: it stops a running
// instance (SIGTERM), builds ./cmd/kubelet-plugin, starts it and returns once
// the kubelet has registered the driver (its log says "Connection changed"
// for DriverName with connected=true, after this start) and the driver's
// ResourceSlices for this node carry exactly the devices this configuration
// publishes (read from the plugin's own --print-slices), so that a stale
// slice of an earlier configuration never counts as ready.
//
// Claims prepared by an earlier instance stay prepared; delete their pods
// first (and wait for their CDI specs to go, see WaitClaimsUnprepared) when
// the device set changes.
func (c *Cluster) StartPluginWith(ctx context.Context, cfg PluginConfig) error {
	if cfg.Profile == "" {
		cfg.Profile = DefaultProfile
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
	c.mu.Unlock()
	alive := []string{compPlugin, compKubelet, compAPIServer}
	if err := c.waitFor(ctx, "kubelet registered "+DriverName, 60*time.Second, alive, func() (bool, error) {
		return kubeletLogShowsConnected(c.LogPath(compKubelet), offset), nil
	}); err != nil {
		return err
	}
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
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.PluginBinary(), append(slices.Clone(args), "--print-slices")...)
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
// up: what a crash or an OOM kill does. Restart it with StartPluginWith
// (for example with c.Plugin()).
func (c *Cluster) KillPlugin() error {
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

// StopPlugin stops the kubelet plugin if it runs. Claims it prepared stay
// prepared; delete their pods first to have them unprepared.
func (c *Cluster) StopPlugin() error { return c.stop(compPlugin, 15*time.Second) }

// StartController builds ./cmd/controller and runs it as a host process
// (`--kubeconfig=<admin> -v=4` plus Options.ControllerArgs). Readiness is
// only that it is still running after two seconds.
func (c *Cluster) StartController(ctx context.Context) error {
	if err := c.stop(compController, 15*time.Second); err != nil {
		return err
	}
	bin := filepath.Join(c.Dirs.Bin, compController)
	c.logf("building ./cmd/controller")
	if err := c.goBuild(ctx, bin, "./cmd/controller"); err != nil {
		return err
	}
	args := append([]string{"--kubeconfig=" + c.Kubeconfig, "-v=4"}, c.Opts.ControllerArgs...)
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

// PluginRunning tells whether the Tessera kubelet plugin runs.
func (c *Cluster) PluginRunning() bool { return c.running(compPlugin) }
