package localcluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// StartPlugin builds ./cmd/kubelet-plugin and runs it as a host process with
// the given mock profile. It returns once the kubelet has registered the
// driver (its log says "Connection changed" for DriverName with
// connected=true, after this start) and a ResourceSlice of the driver for
// this node exists.
func (c *Cluster) StartPlugin(ctx context.Context, profile string) error {
	if profile == "" {
		profile = DefaultProfile
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
	// Only registrations logged after this point count: a stale one from an
	// earlier plugin instance must not.
	offset := fileSize(c.LogPath(compKubelet))
	if err := c.start(compPlugin, c.PluginBinary(), c.PluginArgs(profile), []string{c.hostPath()}); err != nil {
		return err
	}
	alive := []string{compPlugin, compKubelet, compAPIServer}
	if err := c.waitFor(ctx, "kubelet registered "+DriverName, 60*time.Second, alive, func() (bool, error) {
		return kubeletLogShowsConnected(c.LogPath(compKubelet), offset), nil
	}); err != nil {
		return err
	}
	return c.waitFor(ctx, "ResourceSlice of "+DriverName+" on "+NodeName, 60*time.Second, alive, func() (bool, error) {
		slices, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, s := range slices.Items {
			if s.Spec.Driver == DriverName && s.Spec.NodeName != nil && *s.Spec.NodeName == NodeName {
				return true, nil
			}
		}
		return false, nil
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
