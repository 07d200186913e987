// Package mpspod runs each claim's MPS control daemon in a Pod of its own,
// created and deleted by the kubelet plugin, so that a plugin upgrade,
// restart or crash leaves the daemon, and the claim's running MPS clients,
// untouched.
//
// The Pod is named after the claim's UID (PodName), lives in the plugin's
// own namespace, is bound to the plugin's node through spec.nodeName, and
// is not owned by the plugin's Pod: nothing garbage-collects it when the
// plugin goes. Its one container runs the plugin's image as
// `kubelet-plugin mps-daemon` (see mps.Daemon) with the claim's pipe and
// log directories (hostPath, the same paths as on the host) and the
// claim's limits as control commands; it writes the claim's ready file
// once the limits are set. Start creates the Pod or adopts the one that is
// there (a retried prepare, a restarted plugin) and waits, bounded, for
// the ready file; Stop deletes the Pod, waits until it is gone, and
// removes the directories.
//
// The Pod is built only from the plugin's configuration and the claim's
// UID and limits as the plugin computed them: nothing a tenant writes in
// a claim reaches its spec.
package mpspod

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/node/mps"
)

// Labels of a daemon Pod.
const (
	ComponentLabel = "app.kubernetes.io/component"
	Component      = "mps-daemon"
	ClaimUIDLabel  = "mps.tessera.dev/claim-uid"
	NodeLabel      = "mps.tessera.dev/node"
	containerName  = "mps-control-daemon"
)

// PodName is the name of a claim's daemon Pod.
func PodName(uid string) string { return "tessera-mps-" + uid }

// Config is what the plugin's configuration says about daemon Pods.
type Config struct {
	// Namespace is the plugin's own namespace.
	Namespace string
	// NodeName is the plugin's node; the Pods are bound to it.
	NodeName string
	// Image is the plugin's image; the Pods run its kubelet-plugin binary.
	Image           string
	ImagePullPolicy corev1.PullPolicy
	// Binary is the kubelet-plugin binary in Image.
	Binary string
	// Control is nvidia-cuda-mps-control as the daemon's container sees
	// it, or mps.FakeControl.
	Control string
	// DriverRoot is the driver's root on the host and ContainerDriverRoot
	// where the daemon's container mounts it (real GPUs only).
	DriverRoot, ContainerDriverRoot string
	// Root holds the per-claim directories on the host (mps.Dirs).
	Root string
	// PriorityClassName of the Pods; empty for none.
	PriorityClassName string
	// StartTimeout bounds how long Start waits for a daemon to be ready,
	// StopTimeout how long Stop waits for its Pod to be gone.
	StartTimeout, StopTimeout time.Duration
}

// Validate names the missing field and how to set it.
func (c Config) Validate() error {
	for _, f := range []struct{ name, value, fix string }{
		{"namespace", c.Namespace, "set --mps-daemon-namespace or $POD_NAMESPACE"},
		{"node name", c.NodeName, "set --node-name"},
		{"image", c.Image, "set --mps-daemon-image to the plugin's image"},
		{"control", c.Control, "set --mps-control"},
		{"binary", c.Binary, "set --mps-daemon-binary"},
	} {
		if f.value == "" {
			return fmt.Errorf("MPS daemon pods need the %s: %s", f.name, f.fix)
		}
	}
	if !filepath.IsAbs(c.Root) {
		return fmt.Errorf("MPS daemon pods: the directory %q must be absolute", c.Root)
	}
	return nil
}

func (c Config) fake() bool { return c.Control == mps.FakeControl }

// Daemons runs the daemons as Pods; it implements mps.Daemons.
type Daemons struct {
	Config
	Client kubernetes.Interface
	// Poll is how often Start and Stop look; 0 means 250ms.
	Poll time.Duration
}

var _ mps.Daemons = (*Daemons)(nil)

func (d *Daemons) dirs() mps.Dirs { return mps.Dirs{Root: d.Root} }

// Dir is Root.
func (d *Daemons) Dir() string { return d.Root }

// Where is the claim's daemon Pod, namespace/name.
func (d *Daemons) Where(uid string) string { return d.Namespace + "/" + PodName(uid) }

var _ mps.Located = (*Daemons)(nil)

// PipeDir is the claim's pipe directory on the host.
func (d *Daemons) PipeDir(uid string) string { return d.dirs().PipeDir(uid) }

// Pod returns the daemon Pod of a claim with these limits.
func (c Config) Pod(uid string, l mps.Limits) *corev1.Pod {
	dirs := mps.Dirs{Root: c.Root}
	args := []string{mps.DaemonCommand, "--control=" + c.Control, "--ready-file=" + dirs.ReadyFile(uid)}
	for _, cmd := range l.Commands() {
		args = append(args, "--command="+cmd)
	}
	var env []corev1.EnvVar
	for _, e := range dirs.Env(uid, l.Devices) {
		name, value, _ := strings.Cut(e, "=")
		env = append(env, corev1.EnvVar{Name: name, Value: value})
	}
	claimDir := dirs.ClaimDir(uid)
	ctr := corev1.Container{
		Name:            containerName,
		Image:           c.Image,
		ImagePullPolicy: c.ImagePullPolicy,
		Command:         []string{c.Binary},
		Args:            args,
		Env:             env,
		VolumeMounts:    []corev1.VolumeMount{{Name: "claim", MountPath: claimDir}},
	}
	volumes := []corev1.Volume{{Name: "claim", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: claimDir, Type: ptr.To(corev1.HostPathDirectory)}}}}
	if c.fake() {
		// The fake daemon only writes files into the claim's directory
		// (created by the plugin, owned by root).
		ctr.SecurityContext = &corev1.SecurityContext{
			RunAsUser:                ptr.To[int64](0),
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		}
	} else {
		// The real MPS server opens the GPUs' device nodes and must see
		// its clients' processes: privileged, host PID namespace, as
		// NVIDIA's DRA driver runs it.
		ctr.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true), ReadOnlyRootFilesystem: ptr.To(true)}
		if c.DriverRoot != "" && c.ContainerDriverRoot != "" {
			ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: "driver-root", MountPath: c.ContainerDriverRoot, ReadOnly: true})
			volumes = append(volumes, corev1.Volume{Name: "driver-root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: c.DriverRoot, Type: ptr.To(corev1.HostPathDirectory)}}})
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      PodName(uid),
			Namespace: c.Namespace,
			Labels: map[string]string{
				"app.kubernetes.io/name": "tessera",
				ComponentLabel:           Component,
				ClaimUIDLabel:            uid,
				NodeLabel:                c.NodeName,
			},
		},
		Spec: corev1.PodSpec{
			// Bound to the plugin's node, past the scheduler: the daemon
			// must run where the claim's GPU and pipe directory are.
			NodeName:                      c.NodeName,
			RestartPolicy:                 corev1.RestartPolicyAlways,
			HostPID:                       !c.fake(),
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			PriorityClassName:             c.PriorityClassName,
			TerminationGracePeriodSeconds: ptr.To[int64](30),
			// Like the plugin's DaemonSet: a taint on the node must not
			// evict the daemon of a claim that is still prepared.
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:  []corev1.Container{ctr},
			Volumes:     volumes,
		},
	}
}

func (d *Daemons) poll() time.Duration {
	if d.Poll > 0 {
		return d.Poll
	}
	return 250 * time.Millisecond
}

// Start creates the claim's daemon Pod, or adopts the one there, and
// waits until its ready file says the limits are set.
func (d *Daemons) Start(ctx context.Context, uid string, l mps.Limits) (string, error) {
	logger := klog.FromContext(ctx)
	pods := d.Client.CoreV1().Pods(d.Namespace)
	name := PodName(uid)
	timeout := d.StartTimeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			// The directories before the Pod: a crash in between leaves
			// a directory that the orphan scan finds and stops.
			if err := d.dirs().Make(uid); err != nil {
				return "", err
			}
			// A ready file left by an earlier Pod says nothing about
			// the new one.
			if err := os.Remove(d.dirs().ReadyFile(uid)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return "", err
			}
			if _, err := pods.Create(ctx, d.Pod(uid, l), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return "", fmt.Errorf("create the MPS daemon pod %s/%s of claim %s: %w", d.Namespace, name, uid, err)
			}
			logger.V(2).Info("Created MPS daemon pod", "claim", uid, "pod", klog.KRef(d.Namespace, name), "commands", l.Commands())
		case err != nil:
			return "", fmt.Errorf("get the MPS daemon pod %s/%s of claim %s: %w", d.Namespace, name, uid, err)
		case pod.Labels[ClaimUIDLabel] != uid || pod.Spec.NodeName != d.NodeName:
			return "", fmt.Errorf("pod %s/%s is not the MPS daemon of claim %s on node %s (labels %v, node %q): delete it", d.Namespace, name, uid, d.NodeName, pod.Labels, pod.Spec.NodeName)
		case pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
			// Going, or gone for good: wait for it to go and make a new one.
			if pod.DeletionTimestamp == nil {
				if err := d.delete(ctx, name); err != nil {
					return "", err
				}
			}
		case pod.Status.Phase == corev1.PodRunning && d.ready(uid):
			logger.V(2).Info("MPS daemon pod is ready", "claim", uid, "pod", klog.KObj(pod), "podUID", pod.UID)
			return d.PipeDir(uid), nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("the MPS daemon pod %s/%s of claim %s is not ready after %s (%s): see the pod's events and logs", d.Namespace, name, uid, timeout, describe(pod))
		case <-time.After(d.poll()):
		}
	}
}

func describe(pod *corev1.Pod) string {
	if pod == nil {
		return "no pod"
	}
	s := "phase " + string(pod.Status.Phase)
	for _, c := range pod.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil {
			s += ", waiting: " + w.Reason + " " + w.Message
		}
		if t := c.State.Terminated; t != nil {
			s += fmt.Sprintf(", terminated: %s exit %d", t.Reason, t.ExitCode)
		}
		s += fmt.Sprintf(", %d restarts", c.RestartCount)
	}
	return s
}

func (d *Daemons) ready(uid string) bool {
	_, err := os.Stat(d.dirs().ReadyFile(uid))
	return err == nil
}

// Running says whether the claim's daemon Pod is there, not going, and
// ready.
func (d *Daemons) Running(ctx context.Context, uid string) bool {
	pod, err := d.Client.CoreV1().Pods(d.Namespace).Get(ctx, PodName(uid), metav1.GetOptions{})
	return err == nil && pod.DeletionTimestamp == nil && pod.Status.Phase == corev1.PodRunning &&
		pod.Labels[ClaimUIDLabel] == uid && d.ready(uid)
}

func (d *Daemons) delete(ctx context.Context, name string) error {
	err := d.Client.CoreV1().Pods(d.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the MPS daemon pod %s/%s: %w", d.Namespace, name, err)
	}
	return nil
}

// Stop deletes the claim's daemon Pod (its SIGTERM quits the daemon),
// waits until the Pod is gone, and removes the claim's directories.
func (d *Daemons) Stop(ctx context.Context, uid string) error {
	name := PodName(uid)
	pods := d.Client.CoreV1().Pods(d.Namespace)
	timeout := d.StopTimeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pod, err := pods.Get(wctx, name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("get the MPS daemon pod %s/%s of claim %s: %w", d.Namespace, name, uid, err)
	}
	if err == nil {
		if pod.Labels[ClaimUIDLabel] != uid {
			return fmt.Errorf("pod %s/%s is not the MPS daemon of claim %s (labels %v): not deleting it", d.Namespace, name, uid, pod.Labels)
		}
		if err := d.delete(wctx, name); err != nil {
			return err
		}
		for {
			_, err := pods.Get(wctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				break
			}
			select {
			case <-wctx.Done():
				return fmt.Errorf("the MPS daemon pod %s/%s of claim %s is still there after %s", d.Namespace, name, uid, timeout)
			case <-time.After(d.poll()):
			}
		}
		klog.FromContext(ctx).V(2).Info("Deleted MPS daemon pod", "claim", uid, "pod", klog.KRef(d.Namespace, name))
	}
	return d.dirs().Remove(uid)
}
