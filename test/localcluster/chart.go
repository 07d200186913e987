package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

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

// chartAlive are the host processes the chart's pods need: a wait in
// chart mode fails as soon as one of them exits.
var chartAlive = []string{compKubelet, compAPIServer, compContainerd}

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

// chartState is what the harness last installed (a copy).
func (c *Cluster) chartState() chartState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.chart
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
	if err := c.waitFor(ctx, "Deployment "+ChartNamespace+"/"+ChartController+" available", 2*time.Minute, chartAlive, func() (bool, error) {
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
	return c.waitFor(ctx, "webhook configurations carry the controller's CA", time.Minute, chartAlive, func() (bool, error) {
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

// RestartController replaces the chart's controller pods with fresh ones
// (a new process, nothing carried over from what it did before) and waits
// until the new ones are ready and the webhook configurations carry the
// controller's CA. Chart mode only.
func (c *Cluster) RestartController(ctx context.Context) error {
	if !c.ChartMode() {
		return fmt.Errorf("restarting the controller: only the chart's controller is restarted here")
	}
	old, err := c.driverPods(ctx, "controller")
	if err != nil {
		return err
	}
	gone := map[types.UID]bool{}
	for _, p := range old {
		gone[p.UID] = true
		if err := c.Client.CoreV1().Pods(ChartNamespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting controller pod %s: %w", p.Name, err)
		}
	}
	c.logf("restarting the controller: deleted %d pod(s)", len(old))
	if err := c.waitFor(ctx, "a new controller pod ready", 2*time.Minute, chartAlive, func() (bool, error) {
		pods, err := c.driverPods(ctx, "controller")
		if err != nil || len(pods) == 0 {
			return false, nil
		}
		for i := range pods {
			if gone[pods[i].UID] || !podReady(&pods[i]) {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		return err
	}
	return c.waitController(ctx)
}

func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}
