package localcluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// pluginFlagValues maps kubelet plugin flags to the chart's kubeletPlugin
// values; a flag not listed goes to kubeletPlugin.extraArgs as it is.
var pluginFlagValues = map[string]struct {
	path []string
	kind string // "string" or "int"
}{
	"--mock-profile":       {[]string{"mock", "profile"}, "string"},
	"--mock-mig":           {[]string{"mock", "mig"}, "string"},
	"--time-slices":        {[]string{"timeSlices"}, "int"},
	"--mig-mode":           {[]string{"migMode"}, "string"},
	"--reserved-memory":    {[]string{"reservedMemory"}, "string"},
	"--rescan-interval":    {[]string{"rescanInterval"}, "string"},
	"--interposer-library": {[]string{"interposerLibrary"}, "string"},
	"--mps-pipe-dir":       {[]string{"mpsPipeDir"}, "string"},
	"--mps-control":        {[]string{"mpsControl"}, "string"},
	"--mps-mode":           {[]string{"mps", "mode"}, "string"},
	"-v":                   {[]string{"logVerbosity"}, "int"},
	"--v":                  {[]string{"logVerbosity"}, "int"},
}

// chartOwnedPluginFlags are set by the chart itself; the host-mode values
// of Options.PluginArgs for them are dropped in chart mode.
var chartOwnedPluginFlags = []string{"--node-name", "--kubeconfig", "--cdi-root", "--plugin-data-dir", "--registrar-dir", "--mock-device-root", "--gpu-backend"}

// PluginValues returns the chart's kubeletPlugin values for a plugin
// configuration: the profile and every flag of args (Options.PluginArgs,
// then cfg.Args; later flags win, as on a command line) that has a value of
// its own (--time-slices=N: timeSlices, --mock-mig: mock.mig, --mig-mode:
// migMode, -v: logVerbosity, --rescan-interval, --reserved-memory, ...);
// other flags are passed through kubeletPlugin.extraArgs.
func PluginValues(cfg PluginConfig, args ...string) (map[string]any, error) {
	kp := map[string]any{"mock": map[string]any{"profile": cfg.Profile}}
	var extra []string
	for _, a := range append(slices.Clone(args), cfg.Args...) {
		name, value, hasValue := strings.Cut(a, "=")
		if slices.Contains(chartOwnedPluginFlags, name) {
			continue
		}
		m, known := pluginFlagValues[name]
		if !known || !hasValue {
			extra = append(extra, a)
			continue
		}
		var v any = value
		if m.kind == "int" {
			n, err := strconv.Atoi(value)
			if err != nil {
				return nil, fmt.Errorf("plugin flag %s: %w", a, err)
			}
			v = n
		}
		node := kp
		for _, k := range m.path[:len(m.path)-1] {
			next, ok := node[k].(map[string]any)
			if !ok {
				next = map[string]any{}
				node[k] = next
			}
			node = next
		}
		node[m.path[len(m.path)-1]] = v
	}
	if len(extra) > 0 {
		kp["extraArgs"] = extra
	}
	return kp, nil
}

// chartPluginRunning tells whether the chart's plugin pod runs its container.
func (c *Cluster) chartPluginRunning(ctx context.Context) bool {
	if c.Client == nil || !c.chartState().plugin {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	p, err := c.PluginPod(ctx)
	if err != nil || p == nil {
		return false
	}
	cs := containerStatus(p, pluginContainer)
	return cs != nil && cs.State.Running != nil
}

// startPluginChart is StartPluginWith in chart mode; restart forces the
// DaemonSet to roll even when nothing else changed.
func (c *Cluster) startPluginChart(ctx context.Context, cfg PluginConfig, restart bool) error {
	st := c.chartState()
	st.plugin, st.pluginCfg = true, cfg
	if restart {
		st.starts++
	}
	return c.installPlugin(ctx, st, func(m pluginMark) error { return c.waitPluginRollout(ctx, cfg, m) })
}

// installPlugin installs st, whose plugin configuration is st.pluginCfg,
// and then waits for what it rolled out with wait, given the plugin's
// state before the install.
func (c *Cluster) installPlugin(ctx context.Context, st chartState, wait func(pluginMark) error) error {
	m, err := c.markPlugin(ctx)
	if err != nil {
		return err
	}
	if err := c.helmInstall(ctx, st); err != nil {
		return err
	}
	c.mu.Lock()
	c.plugin = st.pluginCfg
	c.mu.Unlock()
	return wait(m)
}

// pluginMark is what a plugin rollout is measured against: the plugin pods
// and DaemonSet generation before it, and the kubelet log's size (only
// registrations logged after it count).
type pluginMark struct {
	old        map[types.UID]bool
	generation int64
	kubeletLog int64
}

// markPlugin records the pluginMark before a helm change; it also saves the
// plugin pods' logs, which the kubelet drops with a replaced pod.
func (c *Cluster) markPlugin(ctx context.Context) (pluginMark, error) {
	m := pluginMark{old: map[types.UID]bool{}}
	if c.chartState().installed {
		pods, err := c.driverPods(ctx, "kubelet-plugin")
		if err != nil {
			return m, err
		}
		for _, p := range pods {
			m.old[p.UID] = true
		}
	}
	if ds, err := c.pluginDaemonSet(ctx); err == nil {
		m.generation = ds.Generation
	} else if !apierrors.IsNotFound(err) {
		return m, err
	}
	c.saveDriverPodLogs()
	m.kubeletLog = fileSize(c.LogPath(compKubelet))
	return m, nil
}

// waitPluginRollout waits, after a helm change, until the DaemonSet runs
// one up-to-date pod (a new one when the pod template changed since m),
// the kubelet registered it and it publishes the devices of cfg.
func (c *Cluster) waitPluginRollout(ctx context.Context, cfg PluginConfig, m pluginMark) error {
	ds, err := c.pluginDaemonSet(ctx)
	if err != nil {
		return fmt.Errorf("the chart's DaemonSet: %w", err)
	}
	rolled := ds.Generation != m.generation
	if !rolled {
		c.logf("the plugin's pod template did not change: no new pod")
	}
	var pod *corev1.Pod
	if err := c.waitFor(ctx, "a new "+ChartPluginDaemonSet+" pod running (DaemonSet rolled out)", 2*time.Minute, chartAlive, func() (bool, error) {
		d, err := c.pluginDaemonSet(ctx)
		if err != nil {
			return false, nil
		}
		pods, err := c.driverPods(ctx, "kubelet-plugin")
		if err != nil {
			return false, nil
		}
		for i := range pods {
			if err := c.podBroken(ctx, &pods[i]); err != nil {
				return false, err
			}
		}
		if len(pods) != 1 || (rolled && m.old[pods[0].UID]) {
			return false, nil
		}
		cs := containerStatus(&pods[0], pluginContainer)
		if cs == nil || cs.State.Running == nil {
			return false, nil
		}
		s := d.Status
		if s.ObservedGeneration < d.Generation || s.DesiredNumberScheduled < 1 || s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberAvailable != s.DesiredNumberScheduled {
			return false, nil
		}
		pod = &pods[0]
		return true, nil
	}); err != nil {
		return err
	}
	if rolled {
		if err := c.waitFor(ctx, "kubelet registered "+DriverName+" (pod "+pod.Name+")", 90*time.Second, chartAlive, func() (bool, error) {
			if p, err := c.Client.CoreV1().Pods(ChartNamespace).Get(ctx, pod.Name, metav1.GetOptions{}); err == nil {
				if err := c.podBroken(ctx, p); err != nil {
					return false, err
				}
			}
			return kubeletLogShowsConnected(c.LogPath(compKubelet), m.kubeletLog), nil
		}); err != nil {
			return err
		}
	}
	want, err := c.chartExpectedDevices(ctx, ds)
	if err != nil {
		c.logf("cannot tell which devices %s publishes (%v); waiting only for a ResourceSlice", cfg, err)
	}
	c.mu.Lock()
	c.expected = want
	c.mu.Unlock()
	return c.waitDevices(ctx, cfg, want, chartAlive)
}

// PluginArgsInChart returns the kubelet plugin container's arguments as the
// chart's DaemonSet has them now.
func (c *Cluster) PluginArgsInChart(ctx context.Context) ([]string, error) {
	ds, err := c.pluginDaemonSet(ctx)
	if err != nil {
		return nil, err
	}
	return daemonSetPluginArgs(ds)
}

// daemonSetPluginArgs are the arguments of the plugin container of ds.
func daemonSetPluginArgs(ds *appsv1.DaemonSet) ([]string, error) {
	for _, ctr := range ds.Spec.Template.Spec.Containers {
		if ctr.Name == pluginContainer {
			return ctr.Args, nil
		}
	}
	return nil, fmt.Errorf("DaemonSet %s has no container %s", ds.Name, pluginContainer)
}

// chartExpectedDevices runs the image's plugin binary on the host with the
// DaemonSet's own arguments plus --print-slices.
func (c *Cluster) chartExpectedDevices(ctx context.Context, ds *appsv1.DaemonSet) ([]string, error) {
	c.mu.Lock()
	img := c.image
	c.mu.Unlock()
	if img == nil || img.plugin == "" {
		return nil, errors.New("no plugin binary from the image")
	}
	args, err := daemonSetPluginArgs(ds)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, a := range args {
		out = append(out, strings.ReplaceAll(a, "$(NODE_NAME)", NodeName))
	}
	return c.printSlicesDevices(ctx, img.plugin, out)
}

// killPluginChart SIGKILLs the process of the plugin's container, found
// through containerd by the container ID the pod reports, and waits until
// the kubelet has restarted the container and registered the driver again.
func (c *Cluster) killPluginChart(ctx context.Context) error {
	pod, err := c.PluginPod(ctx)
	if err != nil {
		return err
	}
	if pod == nil {
		return fmt.Errorf("no pod of %s/%s", ChartNamespace, ChartPluginDaemonSet)
	}
	cs := containerStatus(pod, pluginContainer)
	if cs == nil || cs.State.Running == nil || cs.ContainerID == "" {
		return fmt.Errorf("pod %s: container %s is not running", pod.Name, pluginContainer)
	}
	id := cs.ContainerID[strings.Index(cs.ContainerID, "://")+3:]
	out, err := c.ctr(ctx, "-n", "k8s.io", "tasks", "ls")
	if err != nil {
		return fmt.Errorf("ctr tasks ls: %w: %s", err, out)
	}
	pid := 0
	for _, l := range strings.Split(out, "\n") {
		// TASK PID STATUS
		if f := strings.Fields(l); len(f) >= 3 && f[0] == id {
			pid, _ = strconv.Atoi(f[1])
		}
	}
	if pid <= 1 {
		return fmt.Errorf("containerd lists no task with a PID for container %s of pod %s:\n%s", id, pod.Name, out)
	}
	if !procAlive(pid, pluginExecutable) {
		return fmt.Errorf("pid %d of container %s is not a live %s", pid, id, pluginExecutable)
	}
	offset := fileSize(c.LogPath(compKubelet))
	c.logf("killing the kubelet plugin (pod %s, container %.12s, pid %d) with SIGKILL", pod.Name, id, pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); procAlive(pid, pluginExecutable); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d (%s) survived SIGKILL", pid, pluginExecutable)
		}
	}
	if err := c.waitFor(ctx, "the kubelet restarted container "+pluginContainer+" of "+pod.Name, 90*time.Second, chartAlive, func() (bool, error) {
		p, err := c.Client.CoreV1().Pods(ChartNamespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		now := containerStatus(p, pluginContainer)
		return now != nil && now.State.Running != nil && now.ContainerID != cs.ContainerID && now.RestartCount > cs.RestartCount, nil
	}); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "kubelet registered "+DriverName+" again", 90*time.Second, chartAlive, func() (bool, error) {
		return kubeletLogShowsConnected(c.LogPath(compKubelet), offset), nil
	}); err != nil {
		return err
	}
	c.mu.Lock()
	want := c.expected
	c.mu.Unlock()
	return c.waitDevices(ctx, c.Plugin(), want, chartAlive)
}

// pluginDaemonSet reads the chart's kubelet plugin DaemonSet.
func (c *Cluster) pluginDaemonSet(ctx context.Context) (*appsv1.DaemonSet, error) {
	return c.Client.AppsV1().DaemonSets(ChartNamespace).Get(ctx, ChartPluginDaemonSet, metav1.GetOptions{})
}
