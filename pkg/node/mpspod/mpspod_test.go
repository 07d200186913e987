package mpspod

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tessera-dev/tessera/pkg/node/mps"
)

const uid = "0f3c1a9e-7b2d-4c1e-9a8f-3d2b1c0e9f8a"

var limits = mps.Limits{Devices: []mps.Device{{UUID: "GPU-1", MemMiB: 2048}}, ThreadPercent: 50}

func testConfig(t *testing.T) Config {
	return Config{
		Namespace: "tessera-system", NodeName: "node-1", Image: "tessera.dev/tessera:dev", ImagePullPolicy: corev1.PullNever,
		Binary: "/usr/bin/kubelet-plugin", Control: mps.FakeControl, Root: t.TempDir(),
		StartTimeout: 2 * time.Second, StopTimeout: 2 * time.Second,
	}
}

func TestPodSpec(t *testing.T) {
	for _, tc := range []struct {
		name       string
		control    string
		privileged bool
		mounts     int
	}{
		{name: "mock GPUs: the fake daemon, unprivileged", control: mps.FakeControl, mounts: 1},
		{name: "real GPUs: nvidia-cuda-mps-control from the driver root", control: "/driver-root/usr/bin/nvidia-cuda-mps-control", privileged: true, mounts: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t)
			c.Control = tc.control
			c.DriverRoot, c.ContainerDriverRoot = "/run/nvidia/driver", "/driver-root"
			pod := c.Pod(uid, limits)
			dirs := mps.Dirs{Root: c.Root}
			if pod.Name != "tessera-mps-"+uid || pod.Namespace != "tessera-system" || pod.Spec.NodeName != "node-1" {
				t.Errorf("pod %s/%s on %q", pod.Namespace, pod.Name, pod.Spec.NodeName)
			}
			if pod.Labels[ClaimUIDLabel] != uid || pod.Labels[ComponentLabel] != Component || pod.Labels[NodeLabel] != "node-1" {
				t.Errorf("labels %v", pod.Labels)
			}
			if len(pod.OwnerReferences) != 0 {
				t.Errorf("owned by %v: a plugin restart would take the daemon with it", pod.OwnerReferences)
			}
			if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
				t.Error("the daemon pod mounts a service account token; it needs no API access")
			}
			if pod.Spec.HostPID != tc.privileged {
				t.Errorf("hostPID %v", pod.Spec.HostPID)
			}
			ctr := pod.Spec.Containers[0]
			if ctr.Image != c.Image || ctr.Command[0] != c.Binary {
				t.Errorf("image %s command %v", ctr.Image, ctr.Command)
			}
			wantArgs := []string{mps.DaemonCommand, "--control=" + tc.control, "--ready-file=" + dirs.ReadyFile(uid),
				"--command=set_default_device_pinned_mem_limit GPU-1 2048M", "--command=set_default_active_thread_percentage 50"}
			if !slices.Equal(ctr.Args, wantArgs) {
				t.Errorf("args\n%q\nwant\n%q", ctr.Args, wantArgs)
			}
			env := map[string]string{}
			for _, e := range ctr.Env {
				env[e.Name] = e.Value
			}
			if env["CUDA_MPS_PIPE_DIRECTORY"] != dirs.PipeDir(uid) || env["CUDA_MPS_LOG_DIRECTORY"] != dirs.LogDir(uid) || env["CUDA_VISIBLE_DEVICES"] != "GPU-1" {
				t.Errorf("env %v", env)
			}
			priv := ctr.SecurityContext.Privileged != nil && *ctr.SecurityContext.Privileged
			if priv != tc.privileged {
				t.Errorf("privileged %v", priv)
			}
			if len(ctr.VolumeMounts) != tc.mounts || ctr.VolumeMounts[0].MountPath != dirs.ClaimDir(uid) || pod.Spec.Volumes[0].HostPath.Path != dirs.ClaimDir(uid) {
				t.Errorf("mounts %+v volumes %+v: want the claim's own directory only (and the driver root on real GPUs)", ctr.VolumeMounts, pod.Spec.Volumes)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{name: "complete", change: func(*Config) {}},
		{name: "no namespace", change: func(c *Config) { c.Namespace = "" }, want: "--mps-daemon-namespace"},
		{name: "no image", change: func(c *Config) { c.Image = "" }, want: "--mps-daemon-image"},
		{name: "relative root", change: func(c *Config) { c.Root = "mps" }, want: "absolute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t)
			tc.change(&c)
			err := c.Validate()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Validate() = %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// kubelet plays the node: it runs every daemon pod of the namespace (phase
// Running, ready file written, as the daemon does once its limits are
// set) and finishes deleted ones.
func kubelet(ctx context.Context, t *testing.T, d *Daemons) {
	pods := d.Client.CoreV1().Pods(d.Namespace)
	go func() {
		for ctx.Err() == nil {
			list, err := pods.List(ctx, metav1.ListOptions{})
			if err == nil {
				for _, p := range list.Items {
					if p.Status.Phase == "" {
						p.Status.Phase = corev1.PodRunning
						if _, err := pods.UpdateStatus(ctx, &p, metav1.UpdateOptions{}); err != nil {
							t.Errorf("update status: %v", err)
						}
						if err := os.WriteFile(d.dirs().ReadyFile(p.Labels[ClaimUIDLabel]), nil, 0o644); err != nil {
							t.Errorf("ready file: %v", err)
						}
					}
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
}

func newDaemons(t *testing.T) (*Daemons, *fake.Clientset) {
	client := fake.NewClientset()
	n := 0
	// The API server gives every created object a UID.
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		n++
		a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).UID = types.UID(strings.Repeat("u", n))
		return false, nil, nil
	})
	return &Daemons{Config: testConfig(t), Client: client, Poll: 5 * time.Millisecond}, client
}

func creates(client *fake.Clientset) int {
	n := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "create" && a.GetResource().Resource == "pods" {
			n++
		}
	}
	return n
}

func TestStartStop(t *testing.T) {
	ctx := t.Context()
	d, client := newDaemons(t)
	kubelet(ctx, t, d)

	pipe, err := d.Start(ctx, uid, limits)
	if err != nil {
		t.Fatal(err)
	}
	if pipe != d.PipeDir(uid) {
		t.Errorf("pipe %s, want %s", pipe, d.PipeDir(uid))
	}
	if st, err := os.Stat(pipe); err != nil || st.Mode().Perm() != 0o777 {
		t.Errorf("pipe directory: %v %v", st, err)
	}
	pod, err := client.CoreV1().Pods(d.Namespace).Get(ctx, PodName(uid), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Running(ctx, uid) {
		t.Error("Running() = false after Start")
	}

	// A retried prepare and a restarted plugin (a new Daemons over the
	// same API and directories) adopt the pod: no second create.
	restarted := &Daemons{Config: d.Config, Client: client, Poll: d.Poll}
	for name, dd := range map[string]*Daemons{"retry": d, "restarted plugin": restarted} {
		if !dd.Running(ctx, uid) {
			t.Errorf("%s: Running() = false", name)
		}
		if _, err := dd.Start(ctx, uid, limits); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		again, err := client.CoreV1().Pods(d.Namespace).Get(ctx, PodName(uid), metav1.GetOptions{})
		if err != nil || again.UID != pod.UID {
			t.Errorf("%s: pod %v (%v), want the same pod %s", name, again.UID, err, pod.UID)
		}
	}
	if n := creates(client); n != 1 {
		t.Errorf("%d pod creates, want 1", n)
	}

	for i := range 2 { // idempotent
		if err := restarted.Stop(ctx, uid); err != nil {
			t.Fatalf("Stop #%d: %v", i+1, err)
		}
		if _, err := client.CoreV1().Pods(d.Namespace).Get(ctx, PodName(uid), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Stop #%d: the pod is still there: %v", i+1, err)
		}
		if _, err := os.Stat(d.dirs().ClaimDir(uid)); !os.IsNotExist(err) {
			t.Errorf("Stop #%d: the claim's directory is still there: %v", i+1, err)
		}
		if d.Running(ctx, uid) {
			t.Errorf("Stop #%d: Running() = true", i+1)
		}
	}
}

func TestStartReplacesAFailedPod(t *testing.T) {
	ctx := t.Context()
	d, client := newDaemons(t)
	failed := d.Pod(uid, limits)
	failed.Status.Phase = corev1.PodFailed
	if _, err := client.CoreV1().Pods(d.Namespace).Create(ctx, failed, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := d.dirs().Make(uid); err != nil {
		t.Fatal(err)
	}
	// Left by the failed pod: must not count for the new one.
	if err := os.WriteFile(d.dirs().ReadyFile(uid), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if d.Running(ctx, uid) {
		t.Error("Running() = true for a failed pod")
	}
	kubelet(ctx, t, d)
	if _, err := d.Start(ctx, uid, limits); err != nil {
		t.Fatal(err)
	}
	pod, err := client.CoreV1().Pods(d.Namespace).Get(ctx, PodName(uid), metav1.GetOptions{})
	if err != nil || pod.Status.Phase != corev1.PodRunning || creates(client) != 2 {
		t.Errorf("pod %v phase %s (%v), %d creates: want a new, running pod", pod.UID, pod.Status.Phase, err, creates(client))
	}
}

func TestStartErrors(t *testing.T) {
	t.Run("never ready", func(t *testing.T) {
		d, _ := newDaemons(t)
		d.StartTimeout = 50 * time.Millisecond
		_, err := d.Start(t.Context(), uid, limits)
		if err == nil || !strings.Contains(err.Error(), "not ready after") {
			t.Errorf("Start() = %v, want a not-ready error", err)
		}
	})
	t.Run("a pod of that name that is not the claim's daemon", func(t *testing.T) {
		d, client := newDaemons(t)
		other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: PodName(uid), Namespace: d.Namespace, Labels: map[string]string{"app": "other"}}}
		if _, err := client.CoreV1().Pods(d.Namespace).Create(t.Context(), other, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Start(t.Context(), uid, limits); err == nil || !strings.Contains(err.Error(), "is not the MPS daemon") {
			t.Errorf("Start() = %v, want a refusal", err)
		}
		if err := d.Stop(t.Context(), uid); err == nil {
			t.Error("Stop() deleted a pod that is not the claim's daemon")
		}
	})
}
