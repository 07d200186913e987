package localcluster

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
	"github.com/tessera-dev/tessera/pkg/node/driverfiles/fixture"
	"github.com/tessera-dev/tessera/test/helm"
	"github.com/tessera-dev/tessera/test/imagebuild"
)

// InstallMode says how Tessera's kubelet plugin and controller run in the
// local cluster.
type InstallMode string

const (
	// InstallChart (the default) builds Tessera's image (hack/image, no
	// Docker), imports it into containerd and installs the Helm chart
	// deployments/helm/tessera with deployments/helm/values/localcluster.yaml:
	// the plugin runs as the chart's DaemonSet pod, the controller as its
	// Deployment. A configuration change is a `helm upgrade`.
	InstallChart InstallMode = "chart"
	// InstallHost runs both as host processes built with `go build`
	// (faster to iterate on, logs in <work>/logs).
	InstallHost InstallMode = "host"
)

// DefaultInstallMode is $TESSERA_INSTALL, or InstallChart when it is unset.
func DefaultInstallMode() InstallMode {
	if m := os.Getenv("TESSERA_INSTALL"); m != "" {
		return InstallMode(m)
	}
	return InstallChart
}

// TesseraImage is the image chart mode builds, imports and deploys.
const TesseraImage = helm.LocalClusterImage

// Chart mode names: what deployments/helm/tessera makes for release
// helm.ReleaseName in helm.DefaultNamespace.
const (
	// ChartNamespace is where the chart's pods run (one of DriverNamespaces).
	ChartNamespace = helm.DefaultNamespace
	// ChartPluginDaemonSet is the kubelet plugin's DaemonSet.
	ChartPluginDaemonSet = helm.ReleaseName + "-kubelet-plugin"
	// ChartController is the controller's Deployment.
	ChartController = helm.ReleaseName + "-controller"
	// pluginContainer is the plugin's container in the DaemonSet pod.
	pluginContainer = "kubelet-plugin"
	// pluginExecutable is the plugin's path inside the image.
	pluginExecutable = imagebuild.BinDir + "/kubelet-plugin"
	// StartAnnotation on the plugin's pod template counts StartPluginWith
	// calls, so that each one rolls the DaemonSet (a restart) even when the
	// configuration is unchanged.
	StartAnnotation = "localcluster.tessera.dev/start"
)

// chartState is what the harness last installed with helm.
type chartState struct {
	installed  bool
	plugin     bool           // kubeletPlugin.enabled
	pluginCfg  PluginConfig   // its configuration
	starts     int            // StartAnnotation
	controller bool           // controller.enabled
	values     map[string]any // UpgradeChart's values, merged last
	revision   int            // values files written so far
}

// builtImage is Tessera's image, built once per cluster.
type builtImage struct {
	archive string
	digest  string
	// plugin is /usr/bin/kubelet-plugin extracted from the image: the very
	// binary the DaemonSet runs, used on the host for --print-slices.
	plugin string
}

// ChartMode tells whether Tessera runs through the Helm chart.
func (c *Cluster) ChartMode() bool { return c.Opts.Install == InstallChart }

// chartWanted tells whether Up installs the chart, and so builds the image
// before it starts anything (otherwise the first StartPluginWith or
// StartController builds it).
func (c *Cluster) chartWanted() bool {
	return c.ChartMode() && (c.pluginWanted() || c.Opts.Controller)
}

// helmBinary returns the pinned helm (built from the Go module proxy once).
func (c *Cluster) helmBinary(ctx context.Context) (string, error) {
	c.mu.Lock()
	h := c.helm
	c.mu.Unlock()
	if h != "" {
		return h, nil
	}
	h, err := helm.Binary(ctx, func(f string, a ...any) { c.logf(f, a...) })
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	c.helm = h
	c.mu.Unlock()
	return h, nil
}

// Helm runs the pinned helm against the cluster (admin kubeconfig; helm's
// cache, configuration and data directories inside the work directory) and
// returns its combined output.
func (c *Cluster) Helm(ctx context.Context, args ...string) (string, error) {
	bin, err := c.helmBinary(ctx)
	if err != nil {
		return "", err
	}
	home := filepath.Join(c.Dirs.Root, "helm")
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = c.Opts.RepoRoot
	cmd.Env = []string{c.hostPath(), "HOME=" + home, "KUBECONFIG=" + c.Kubeconfig,
		"HELM_CACHE_HOME=" + filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME=" + filepath.Join(home, "config"),
		"HELM_DATA_HOME=" + filepath.Join(home, "data"),
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// ensureImage builds Tessera's image (once per Cluster value), imports it
// into containerd's k8s.io namespace unless an image of the same digest is
// already there, and extracts the plugin binary for --print-slices.
func (c *Cluster) ensureImage(ctx context.Context) (*builtImage, error) {
	c.mu.Lock()
	img := c.image
	c.mu.Unlock()
	if img == nil {
		archive := filepath.Join(c.Dirs.Images, "tessera.tar")
		start := time.Now()
		c.logf("building image %s from %s (hack/image; no Docker)", helm.LocalClusterImage, imagebuild.ManifestPath)
		stop := progress(30*time.Second, func(elapsed time.Duration) {
			c.logf("  still building the image (%s; a cold Go build cache takes minutes)", elapsed.Round(time.Second))
		})
		res, err := imagebuild.Build(ctx, imagebuild.Options{
			RepoRoot: c.Opts.RepoRoot,
			Tag:      helm.LocalClusterImage,
			Output:   archive,
			Logf:     func(f string, a ...any) { c.logf("  image: "+f, a...) },
		})
		stop()
		if err != nil {
			return nil, fmt.Errorf("building the image: %w", err)
		}
		img = &builtImage{archive: archive, digest: res.Digest.String()}
		c.logf("built %s %s with %s (%s)", res.Tag, img.digest, strings.Join(res.Commands, ", "), time.Since(start).Round(100*time.Millisecond))
		if slices.Contains(res.Commands, "kubelet-plugin") {
			img.plugin = filepath.Join(c.Dirs.Bin, "tessera-kubelet-plugin-image")
			if err := extractFromImage(archive, strings.TrimPrefix(pluginExecutable, "/"), img.plugin); err != nil {
				return nil, fmt.Errorf("extracting %s from the image: %w", pluginExecutable, err)
			}
		}
		c.mu.Lock()
		c.image = img
		c.mu.Unlock()
	}
	if !c.running(compContainerd) {
		return img, nil // imported once containerd runs (Up)
	}
	if got, _ := c.imageDigest(ctx, helm.LocalClusterImage); got == img.digest {
		return img, nil
	}
	c.logf("importing %s into containerd (no registry involved)", helm.LocalClusterImage)
	if out, err := c.ctr(ctx, "-n", "k8s.io", "images", "import", "--snapshotter", "overlayfs", img.archive); err != nil {
		return nil, fmt.Errorf("importing %s: %w\n%s", img.archive, err, out)
	}
	if got, err := c.imageDigest(ctx, helm.LocalClusterImage); got != img.digest {
		return nil, fmt.Errorf("image %s in containerd has digest %q after import, want %s (err %v)", helm.LocalClusterImage, got, img.digest, err)
	}
	return img, nil
}

// imageDigest is the manifest digest containerd lists for ref ("" if none).
func (c *Cluster) imageDigest(ctx context.Context, ref string) (string, error) {
	out, err := c.ctr(ctx, "-n", "k8s.io", "images", "ls")
	if err != nil {
		return "", fmt.Errorf("ctr images ls: %w: %s", err, out)
	}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == ref {
			return f[2], nil
		}
	}
	return "", nil
}

// extractFromImage copies one file of the (only) image in an OCI layout
// archive to dst, executable.
func extractFromImage(archive, name, dst string) error {
	dir, err := os.MkdirTemp("", "tessera-image-layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := untar(archive, dir); err != nil {
		return err
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	if len(m.Manifests) != 1 {
		return fmt.Errorf("%s holds %d manifests, want 1", archive, len(m.Manifests))
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		return err
	}
	fs := mutate.Extract(img)
	defer fs.Close()
	tr := tar.NewReader(fs)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return fmt.Errorf("no %s in the image", name)
		}
		if err != nil {
			return err
		}
		if strings.TrimPrefix(h.Name, "./") != name || h.Typeflag != tar.TypeReg {
			continue
		}
		tmp := dst + ".tmp"
		f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		return os.Rename(tmp, dst)
	}
}

// untar unpacks the regular files and directories of a tar archive.
func untar(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			out, err := os.Create(p)
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, tr); err != nil {
				out.Close()
				return err
			}
			if err := out.Close(); err != nil {
				return err
			}
		}
	}
}

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

// chartValues is the values file the harness adds after LocalClusterValues.
func (c *Cluster) chartValues(st chartState) (map[string]any, error) {
	kp := map[string]any{"enabled": st.plugin}
	if st.plugin {
		var err error
		if kp, err = PluginValues(st.pluginCfg, c.Opts.PluginArgs...); err != nil {
			return nil, err
		}
		kp["enabled"] = true
		kp["podAnnotations"] = map[string]any{StartAnnotation: strconv.Itoa(st.starts)}
	}
	ctl := map[string]any{"enabled": st.controller}
	if len(c.Opts.ControllerArgs) > 0 {
		ctl["extraArgs"] = c.Opts.ControllerArgs
	}
	// The chart refuses webhooks without the controller that serves them.
	vals := map[string]any{"kubeletPlugin": kp, "controller": ctl, "webhook": map[string]any{"enabled": st.controller}}
	mergeValues(vals, c.Opts.ChartValues)
	mergeValues(vals, st.values)
	return vals, nil
}

// mergeValues merges src into dst: maps key by key, anything else replaced.
func mergeValues(dst, src map[string]any) {
	for k, v := range src {
		if sv, ok := v.(map[string]any); ok {
			if dv, ok := dst[k].(map[string]any); ok {
				mergeValues(dv, sv)
				continue
			}
		}
		dst[k] = v
	}
}

// helmInstall runs `helm upgrade --install` of the chart with
// LocalClusterValues and the values of st, without waiting (the callers
// wait for what they need and fail fast on a broken pod).
func (c *Cluster) helmInstall(ctx context.Context, st chartState) error {
	if _, err := c.ensureImage(ctx); err != nil {
		return err
	}
	if err := c.ensureDriverRoot(ctx); err != nil {
		return err
	}
	vals, err := c.chartValues(st)
	if err != nil {
		return err
	}
	b, err := yaml.Marshal(vals)
	if err != nil {
		return err
	}
	st.revision++
	dir := filepath.Join(c.Dirs.Root, "helm")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	file := filepath.Join(dir, fmt.Sprintf("values-%02d.yaml", st.revision))
	if err := os.WriteFile(file, b, 0o644); err != nil {
		return err
	}
	args := slices.DeleteFunc(helm.LocalClusterInstallArgs(c.Opts.RepoRoot, c.Kubeconfig, c.Dirs.MockDevices, "", "--values", file,
		"--set-string", "kubeletPlugin.mock.driverRoot="+c.Dirs.DriverRoot),
		func(a string) bool { return a == "--wait" })
	c.logf("helm %s   # %s", strings.Join(args, " "), strings.Join(strings.Fields(strings.ReplaceAll(string(b), "\n", " ")), " "))
	start := time.Now()
	hctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := c.Helm(hctx, args...); err != nil {
		return err
	}
	st.installed = true
	c.mu.Lock()
	c.previousChart, c.chart = c.chart, st
	c.mu.Unlock()
	c.logf("helm upgrade --install done (%s)", time.Since(start).Round(10*time.Millisecond))
	return nil
}

// ensureDriverRoot builds the fixture driver root for the mock GPUs'
// driver version, once per Cluster value: real ELF libraries, so that the
// plugin's nvcdi path and the runtime's hooks work as on a GPU node.
func (c *Cluster) ensureDriverRoot(ctx context.Context) error {
	c.driverRootOnce.Do(func() {
		c.logf("building the fixture driver root %s (driver %s)", c.Dirs.DriverRoot, nvmlmock.DefaultDriverVersion)
		c.driverRootErr = fixture.Build(ctx, c.Dirs.DriverRoot, nvmlmock.DefaultDriverVersion, "")
	})
	return c.driverRootErr
}

func (c *Cluster) chartState() chartState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.chart
}

// PluginPod returns the running (not terminating) pod of the chart's
// kubelet plugin DaemonSet; nil when there is none.
func (c *Cluster) PluginPod(ctx context.Context) (*corev1.Pod, error) {
	pods, err := c.driverPods(ctx, "kubelet-plugin")
	if err != nil || len(pods) == 0 {
		return nil, err
	}
	return &pods[0], nil
}

// driverPods lists the chart's pods of one component that are not being
// deleted, newest first.
func (c *Cluster) driverPods(ctx context.Context, component string) ([]corev1.Pod, error) {
	list, err := c.Client.CoreV1().Pods(ChartNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/instance=" + helm.ReleaseName + ",app.kubernetes.io/component=" + component,
	})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[j].CreationTimestamp.Before(&out[i].CreationTimestamp) })
	return out, nil
}

func containerStatus(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == name {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// brokenReasons are container states that do not get better by waiting.
var brokenReasons = []string{"ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName",
	"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff"}

// podBroken returns an error (with the container's log) when a container of
// the pod is in a state that waiting does not cure.
func (c *Cluster) podBroken(ctx context.Context, p *corev1.Pod) error {
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && slices.Contains(brokenReasons, w.Reason) {
			return fmt.Errorf("pod %s/%s container %s: %s: %s\n%s", p.Namespace, p.Name, cs.Name, w.Reason, w.Message, c.containerLog(ctx, p, cs.Name, cs.RestartCount > 0))
		}
	}
	if p.Status.Phase == corev1.PodFailed {
		return fmt.Errorf("pod %s/%s failed: %s %s", p.Namespace, p.Name, p.Status.Reason, p.Status.Message)
	}
	return nil
}

// containerLog returns the last 30 lines of a container's log (the
// previous instance's when previous).
func (c *Cluster) containerLog(ctx context.Context, p *corev1.Pod, container string, previous bool) string {
	tailLines := int64(30)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := c.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: container, Previous: previous, TailLines: &tailLines}).DoRaw(ctx)
	if err != nil {
		return fmt.Sprintf("(log of %s/%s: %v)", p.Name, container, err)
	}
	return fmt.Sprintf("last lines of %s/%s:\n%s", p.Name, container, b)
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
	if ds, err := c.Client.AppsV1().DaemonSets(ChartNamespace).Get(ctx, ChartPluginDaemonSet, metav1.GetOptions{}); err == nil {
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
	ds, err := c.Client.AppsV1().DaemonSets(ChartNamespace).Get(ctx, ChartPluginDaemonSet, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the chart's DaemonSet: %w", err)
	}
	rolled := ds.Generation != m.generation
	if !rolled {
		c.logf("the plugin's pod template did not change: no new pod")
	}
	alive := []string{compKubelet, compAPIServer, compContainerd}
	var pod *corev1.Pod
	if err := c.waitFor(ctx, "a new "+ChartPluginDaemonSet+" pod running (DaemonSet rolled out)", 2*time.Minute, alive, func() (bool, error) {
		d, err := c.Client.AppsV1().DaemonSets(ChartNamespace).Get(ctx, ChartPluginDaemonSet, metav1.GetOptions{})
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
		if err := c.waitFor(ctx, "kubelet registered "+DriverName+" (pod "+pod.Name+")", 90*time.Second, alive, func() (bool, error) {
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
	return c.waitDevices(ctx, cfg, want, alive)
}

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

// PluginArgsInChart returns the kubelet plugin container's arguments as the
// chart's DaemonSet has them now.
func (c *Cluster) PluginArgsInChart(ctx context.Context) ([]string, error) {
	ds, err := c.Client.AppsV1().DaemonSets(ChartNamespace).Get(ctx, ChartPluginDaemonSet, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return daemonSetPluginArgs(ds)
}

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
	alive := []string{compKubelet, compAPIServer, compContainerd}
	if err := c.waitFor(ctx, "the kubelet restarted container "+pluginContainer+" of "+pod.Name, 90*time.Second, alive, func() (bool, error) {
		p, err := c.Client.CoreV1().Pods(ChartNamespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		now := containerStatus(p, pluginContainer)
		return now != nil && now.State.Running != nil && now.ContainerID != cs.ContainerID && now.RestartCount > cs.RestartCount, nil
	}); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "kubelet registered "+DriverName+" again", 90*time.Second, alive, func() (bool, error) {
		return kubeletLogShowsConnected(c.LogPath(compKubelet), offset), nil
	}); err != nil {
		return err
	}
	c.mu.Lock()
	want := c.expected
	c.mu.Unlock()
	return c.waitDevices(ctx, c.Plugin(), want, alive)
}

// startControllerChart enables the controller in the release and waits
// until its Deployment is available and both webhook configurations carry
// the controller's CA.
func (c *Cluster) startControllerChart(ctx context.Context) error {
	st := c.chartState()
	if !st.installed || !st.controller {
		st.controller = true
		if err := c.helmInstall(ctx, st); err != nil {
			return err
		}
	}
	return c.waitController(ctx)
}

// waitController waits until the controller's Deployment has rolled out
// (every replica updated and available) and both webhook configurations
// carry the controller's CA.
func (c *Cluster) waitController(ctx context.Context) error {
	alive := []string{compKubelet, compAPIServer, compContainerd}
	if err := c.waitFor(ctx, "Deployment "+ChartNamespace+"/"+ChartController+" available", 2*time.Minute, alive, func() (bool, error) {
		pods, err := c.driverPods(ctx, "controller")
		if err != nil {
			return false, nil
		}
		for i := range pods {
			if err := c.podBroken(ctx, &pods[i]); err != nil {
				return false, err
			}
		}
		d, err := c.Client.AppsV1().Deployments(ChartNamespace).Get(ctx, ChartController, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		s := d.Status
		return s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == want && s.AvailableReplicas == want && s.Replicas == want, nil
	}); err != nil {
		return err
	}
	return c.waitFor(ctx, "webhook configurations carry the controller's CA", time.Minute, alive, func() (bool, error) {
		mw, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, helm.ReleaseName+"-pod-admission", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		vw, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, helm.ReleaseName+"-queue-validation", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, w := range mw.Webhooks {
			if len(w.ClientConfig.CABundle) == 0 {
				return false, nil
			}
		}
		for _, w := range vw.Webhooks {
			if len(w.ClientConfig.CABundle) == 0 {
				return false, nil
			}
		}
		return true, nil
	})
}

// ChartRevision is the release's revision (helm status), 0 when there is
// no release.
func (c *Cluster) ChartRevision(ctx context.Context) (int, error) {
	out, err := c.Helm(ctx, "status", helm.ReleaseName, "--namespace", ChartNamespace, "--kubeconfig", c.Kubeconfig, "-o", "json")
	if err != nil {
		if strings.Contains(out, "not found") {
			return 0, nil
		}
		return 0, err
	}
	var s struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		return 0, fmt.Errorf("helm status: %w", err)
	}
	return s.Version, nil
}

// driverPodLogs lists the kubelet's log files of the containers of pods
// in DriverNamespaces (the chart's pods), sorted.
func (c *Cluster) driverPodLogs() []string {
	var out []string
	for _, ns := range DriverNamespaces {
		m, _ := filepath.Glob(filepath.Join(c.podLogsDir(), ns+"_*", "*", "*.log"))
		out = append(out, m...)
	}
	sort.Strings(out)
	return out
}

// driverPodLogName names a copied driver pod log:
// pod_<namespace>_<pod>_<container>_<restart>.log.
func (c *Cluster) driverPodLogName(p string) string {
	rel, err := filepath.Rel(c.podLogsDir(), p)
	if err != nil {
		return filepath.Base(p)
	}
	parts := strings.Split(rel, string(filepath.Separator)) // <ns>_<pod>_<uid>/<container>/<n>.log
	if len(parts) != 3 {
		return strings.ReplaceAll(rel, string(filepath.Separator), "_")
	}
	podDir := parts[0]
	if i := strings.LastIndexByte(podDir, '_'); i > 0 {
		podDir = podDir[:i] // without the UID
	}
	return "pod_" + podDir + "_" + parts[1] + "_" + parts[2]
}

// saveDriverPodLogs copies the driver pods' container logs into the logs
// directory (they would go with the kubelet's state at teardown).
func (c *Cluster) saveDriverPodLogs() {
	for _, p := range c.driverPodLogs() {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		_ = os.WriteFile(filepath.Join(c.Dirs.Logs, c.driverPodLogName(p)), b, 0o644)
	}
}
