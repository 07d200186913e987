//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/node/enforce"
)

// usernsScript tries to cover the claim's read-only /etc/ld.so.preload from
// inside a new user and mount namespace (where the process has
// CAP_SYS_ADMIN over its own mounts), then to open the GPU there; it says
// how far it got, and sleeps.
const usernsScript = `grep Seccomp: /proc/self/status
echo "PRELOAD: [$(cat /etc/ld.so.preload)]"
: > /tmp/empty
if unshare -Urm sh -c 'mount --bind /tmp/empty /etc/ld.so.preload && echo "COVERED: [$(cat /etc/ld.so.preload)]" && cat /dev/nvidia0 > /dev/null && echo "OPENED /dev/nvidia0"' 2>&1; then
  echo "USERNS: ok"
else
  echo "USERNS: refused"
fi
echo "AFTER: [$(cat /etc/ld.so.preload)]"
echo "OVERRIDE: [$(cat /overrideEnv 2>&1)]"
echo "CUDA_REDIRECT=$CUDA_REDIRECT"
echo CUDA_DEVICE_MEMORY_LIMIT_0=80g > /overrideEnv 2>/dev/null; rm -f /overrideEnv 2>/dev/null; mv /overrideEnv /tmp/o 2>/dev/null
echo "OVERRIDE AFTER WRITE: [$(cat /overrideEnv 2>&1)]"
exec sleep 3600`

// TestSandboxAttacks acts as namespace users with the built-in `edit` role
// on the real cluster with the chart's sandbox policy (docs/security.md,
// "The sandbox"), in a managed namespace: pods that would reach the node's
// files (hostPath of /var/run/cdi, privileged, the host's network) are
// refused; a claim pod's attempt to cover its read-only /etc/ld.so.preload
// from a user namespace fails under the seccomp profile its node gives it
// (the same attempt succeeds in a namespace an administrator exempted, with
// seccomp Unconfined: the control); every variable HAMi-core reads is
// refused in env, from a key and as an envFrom prefix; the running
// container's interposer inputs are the driver's. It prints the table
// docs/security.md carries.
func TestSandboxAttacks(t *testing.T) {
	requireChart(t, "the sandbox is a policy the chart installs")
	usePlugin(t, interposerPlugin(t))
	ctx := t.Context()
	startController(t)
	admin := cluster.Client
	managed, exempt := newNamespace(t), exemptNamespace(t)
	applyYAML(t, `apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: sandbox}
spec:
  resources:
    gpu.tessera.dev/memory: {quota: 4Gi, limit: 4Gi}
`)
	nsObj, err := admin.CoreV1().Namespaces().Get(ctx, managed, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nsObj.Labels["tessera.dev/queue"] = "sandbox"
	if _, err := admin.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	tenant := editClient(t, managed)
	pods := tenant.CoreV1().Pods(managed)
	interposer := `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","enforcement":"interposer"}`
	if _, err := tenant.ResourceV1().ResourceClaimTemplates(managed).Create(ctx, shareTemplate("gpu", "1Gi", interposer), metav1.CreateOptions{}); err != nil {
		t.Fatalf("tenant creates its template: %v", err)
	}
	createTemplate(t, exempt, shareTemplate("gpu", "1Gi", interposer))

	hostPathPod := func(name, path string) *corev1.Pod {
		p := busyboxPod(name, "sh", "-c", "ls /host; exec sleep 3600")
		p.Spec.Volumes = []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "host", MountPath: "/host"}}
		return p
	}
	// The policy sees the namespace's queue label once the API server's
	// namespace informer does.
	waitFor(t, 30*time.Second, "namespace "+managed+" managed by the sandbox policy", func(ctx context.Context) (bool, error) {
		_, err := pods.Create(ctx, hostPathPod("probe", "/var/run/cdi"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "hostPath"), nil
	})

	var rows []attack
	row := func(name string, held bool, outcome string, args ...any) {
		rows = append(rows, attack{name: name, held: held, outcome: fmt.Sprintf(outcome, args...)})
		if !held {
			t.Errorf("attack %q succeeded: %s", name, fmt.Sprintf(outcome, args...))
		}
	}
	refusal := func(err error, want string) (bool, string) {
		if err == nil {
			return false, "allowed"
		}
		msg := err.Error()
		if i := strings.Index(msg, "denied request: "); i >= 0 {
			msg = msg[i+len("denied request: "):]
		}
		if i := strings.Index(msg, "Tessera's sandbox: "); i >= 0 {
			msg = msg[i+len("Tessera's sandbox: "):]
		}
		return strings.Contains(err.Error(), want), "refused: " + msg
	}
	create := func(p *corev1.Pod) error {
		_, err := pods.Create(ctx, p, metav1.CreateOptions{})
		return err
	}

	// 1. The node's files and namespaces.
	held, out := refusal(create(hostPathPod("cdi", "/var/run/cdi")), "hostPath volumes")
	row("mount the node's /var/run/cdi read-write (hostPath, managed namespace)", held, "%s", out)
	held, out = refusal(create(hostPathPod("plugin-data", "/var/lib/kubelet/plugins/gpu.tessera.dev")), "hostPath volumes")
	row("mount the plugin's data directory (hostPath)", held, "%s", out)
	priv := busyboxPod("privileged", "sleep", "3600")
	priv.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
	held, out = refusal(create(priv), "is privileged")
	row("run a privileged pod (managed namespace)", held, "%s", out)
	hostNet := busyboxPod("hostnet", "sleep", "3600")
	hostNet.Spec.HostNetwork = true
	held, out = refusal(create(hostNet), "host's namespaces (hostNetwork)")
	row("run a hostNetwork pod (managed namespace)", held, "%s", out)
	hostPID := claimPod("hostpid", "gpu")
	hostPID.Spec.HostPID = true
	held, out = refusal(create(hostPID), "host's namespaces (hostPID)")
	row("run a claim pod in the host's PID namespace", held, "%s", out)
	sysAdmin := claimPod("sys-admin", "gpu")
	sysAdmin.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}}
	held, out = refusal(create(sysAdmin), "adds capabilities beyond Pod Security baseline's")
	row("add CAP_SYS_ADMIN to a claim pod", held, "%s", out)
	unconfined := claimPod("unconfined", "gpu")
	unconfined.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}
	held, out = refusal(create(unconfined), "seccomp Unconfined")
	row("run a claim pod with seccomp Unconfined", held, "%s", out)

	// 2. The user namespace: the tenant's claim pod (no seccomp profile of
	// its own: the node's kubelet gives it RuntimeDefault) and the control
	// in the exempt namespace, Unconfined.
	attacker := claimPod("userns", "gpu")
	attacker.Spec.Containers[0].Command = []string{"sh", "-c", usernsScript}
	if err := create(attacker); err != nil {
		t.Fatalf("tenant creates its claim pod: %v", err)
	}
	control := claimPod("userns-control", "gpu")
	control.Spec.Containers[0].Command = []string{"sh", "-c", usernsScript}
	control.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}
	createPod(t, exempt, control)
	logs := map[string]string{}
	for _, p := range []struct{ ns, name string }{{managed, "userns"}, {exempt, "userns-control"}} {
		waitPodPhase(t, p.ns, p.name, corev1.PodRunning, 2*time.Minute)
		waitFor(t, time.Minute, p.name+"'s output", func(context.Context) (bool, error) {
			logs[p.name] = podLogs(t, p.ns, p.name)
			return strings.Contains(logs[p.name], "OVERRIDE AFTER WRITE"), nil
		})
		t.Logf("%s:\n%s", p.name, logs[p.name])
	}
	lib := "/usr/local/tessera/lib/libvgpu.so"
	attack, ctl := logs["userns"], logs["userns-control"]
	if !strings.Contains(ctl, "USERNS: ok") || !strings.Contains(ctl, "COVERED: []") || !strings.Contains(ctl, "PRELOAD: ["+lib+"]") {
		t.Errorf("the control (seccomp Unconfined, exempt namespace) did not cover the preload file from a user namespace: the attack proves nothing\n%s", ctl)
	}
	held = strings.Contains(attack, "USERNS: refused") && !strings.Contains(attack, "COVERED") && strings.Contains(attack, "AFTER: ["+lib+"]")
	if !strings.Contains(attack, "Seccomp:\t2") || !strings.Contains(ctl, "Seccomp:\t0") {
		t.Errorf("seccomp modes: the attacker's should be 2 (a filter: the node's RuntimeDefault), the control's 0 (Unconfined)")
	}
	why := "unshare refused"
	for _, line := range strings.Split(attack, "\n") {
		if strings.Contains(line, "unshare") {
			why = strings.TrimSpace(line)
		}
	}
	row("cover the claim's read-only /etc/ld.so.preload from a user namespace (unshare -Urm)", held,
		"%s; the preload file still names %s (control, Unconfined in an exempt namespace: covered)", why, lib)
	env := map[string]string{}
	for _, line := range strings.Split(attack, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	row("hand out the real driver's cu* symbols (CUDA_REDIRECT) or override the env from /overrideEnv",
		env["CUDA_REDIRECT"] == lib && strings.Contains(attack, "OVERRIDE: []") && strings.Contains(attack, "OVERRIDE AFTER WRITE: []"),
		"CUDA_REDIRECT=%s (the interposer itself); /overrideEnv is the node's /dev/null: empty, still empty after a write, and cannot be removed or moved", env["CUDA_REDIRECT"])

	// 3. Ephemeral containers: edit has no pods/ephemeralcontainers, and
	// whoever has it (here the admin) gets the same rules.
	running, err := pods.Get(ctx, "userns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	debug := running.DeepCopy()
	debug.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
		Name: "debug", Image: running.Spec.Containers[0].Image, ImagePullPolicy: corev1.PullNever, Command: []string{"sh"},
		SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
	}}}
	_, err = pods.UpdateEphemeralContainers(ctx, "userns", debug.DeepCopy(), metav1.UpdateOptions{})
	held, out = refusal(err, "forbidden")
	row("add a privileged ephemeral container (kubectl debug)", held, "%s", out)
	_, err = admin.CoreV1().Pods(managed).UpdateEphemeralContainers(ctx, "userns", debug.DeepCopy(), metav1.UpdateOptions{})
	held, out = refusal(err, "container debug is privileged")
	row("— the same with pods/ephemeralcontainers (a user who has it)", held, "%s", out)

	// 4. Every variable HAMi-core reads, in env, from a key and as an
	// envFrom prefix.
	var names []string
	for _, n := range enforce.HAMiCoreEnv {
		if !slices.Contains(enforce.HAMiCoreEnvAllowed, n) {
			names = append(names, strings.ReplaceAll(n, "<i>", "0"))
		}
	}
	var envHeld, fromHeld, prefixHeld []string
	envOK, fromOK, prefixOK := true, true, true
	for _, name := range names {
		p := claimPod("env", "gpu")
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: name, Value: "0"}}
		if held, _ := refusal(create(p), "sets a variable the GPU enforcement reads"); held {
			envHeld = append(envHeld, name)
		} else {
			envOK = false
			t.Errorf("the claim pod's env sets %s: allowed", name)
		}
		p = claimPod("valuefrom", "gpu")
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: name, ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Key: "k"}}}}
		if held, _ := refusal(create(p), "sets a variable the GPU enforcement reads"); held {
			fromHeld = append(fromHeld, name)
		} else {
			fromOK = false
			t.Errorf("the claim pod's env sets %s from a ConfigMap key: allowed", name)
		}
		prefix := name[:max(1, strings.IndexByte(name, '_')+1)]
		p = claimPod("envfrom", "gpu")
		p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{Prefix: prefix, ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}}
		if held, _ := refusal(create(p), "envFrom prefix"); held {
			prefixHeld = append(prefixHeld, prefix)
		} else {
			prefixOK = false
			t.Errorf("the claim pod's envFrom prefix %s (could make %s): allowed", prefix, name)
		}
	}
	row(fmt.Sprintf("set each of the %d variables HAMi-core reads in env", len(names)), envOK, "refused: %s", strings.Join(envHeld, ", "))
	row("— from a ConfigMap key (valueFrom)", fromOK, "refused: %d of %d", len(fromHeld), len(names))
	row("— as an envFrom prefix that could make them", prefixOK, "refused: %s", strings.Join(slices.Compact(slices.Sorted(slices.Values(prefixHeld))), ", "))

	var sb strings.Builder
	tw := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTACK (as a tenant with edit)\tHELD\tOUTCOME")
	for _, r := range rows {
		o := r.outcome
		if len(o) > 160 {
			o = o[:157] + "..."
		}
		fmt.Fprintf(tw, "%s\t%v\t%s\n", r.name, r.held, o)
	}
	tw.Flush()
	t.Logf("sandbox attacks:\n%s", sb.String())
	fmt.Println(sb.String())
}
