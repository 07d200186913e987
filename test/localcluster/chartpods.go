package localcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/test/helm"
)

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

// containerStatus is the status of a pod's container; nil when it has none.
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
func (c *Cluster) saveDriverPodLogs() { c.copyDriverPodLogs(c.Dirs.Logs) }

// copyDriverPodLogs copies the driver pods' container logs into dir, named
// by driverPodLogName; logs that cannot be read are skipped.
func (c *Cluster) copyDriverPodLogs(dir string) {
	for _, p := range c.driverPodLogs() {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		_ = os.WriteFile(filepath.Join(dir, c.driverPodLogName(p)), b, 0o644)
	}
}
