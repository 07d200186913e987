//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/test/localcluster"
	"github.com/tessera-dev/tessera/test/scenario"
)

// defaultPlugin is the configuration tests without special needs run with.
var defaultPlugin = localcluster.PluginConfig{Profile: localcluster.DefaultProfile}

// usePlugin makes sure the kubelet plugin runs with cfg, restarting it
// (after every claim of earlier tests is unprepared) when it runs with
// another configuration or not at all. Tests are skipped when the cluster
// runs without the plugin on purpose.
func usePlugin(t *testing.T, cfg localcluster.PluginConfig) {
	t.Helper()
	if cluster.Opts.Plugin == localcluster.PluginOff {
		t.Skip("the cluster runs without the Tessera kubelet plugin (TESSERA_PLUGIN=off)")
	}
	setupMu.Lock()
	defer setupMu.Unlock()
	if cluster.PluginRunning() && cluster.Plugin().Equal(cfg) {
		return
	}
	if err := cluster.WaitClaimsUnprepared(t.Context(), time.Minute); err != nil {
		t.Fatalf("before restarting the plugin: %v", err)
	}
	t.Logf("(re)starting the kubelet plugin with %s", cfg)
	if err := cluster.StartPluginWith(t.Context(), cfg); err != nil {
		t.Fatalf("starting the kubelet plugin with %s: %v", cfg, err)
	}
}

// logWriter sends the scenario narrative to the test log, a line at a time.
type logWriter struct {
	t   *testing.T
	mu  sync.Mutex
	buf []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		w.t.Log(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
}

func scenarioEnv(t *testing.T) *scenario.Env {
	return &scenario.Env{
		Client:      cluster.Client,
		Kubectl:     cluster.Kubectl,
		RepoRoot:    cluster.Opts.RepoRoot,
		Out:         &logWriter{t: t},
		StepTimeout: 2 * time.Minute,
	}
}

// runScenario applies demo/<name> in a fresh namespace with the plugin
// configuration the scenario names, and returns the run and where every
// pod landed.
func runScenario(t *testing.T, name string) (*scenario.Run, map[string]scenario.Placement) {
	t.Helper()
	s, ok := scenario.Find(name)
	if !ok {
		t.Fatalf("no scenario %s", name)
	}
	usePlugin(t, s.Plugin)
	ns := newNamespace(t)
	r := scenario.NewRun(scenarioEnv(t), s, ns)
	if err := r.Apply(t.Context()); err != nil {
		t.Fatalf("applying demo/%s: %v", name, err)
	}
	return r, placements(t, r)
}

// placements reads where every pod of the run landed and logs it.
func placements(t *testing.T, r *scenario.Run) map[string]scenario.Placement {
	t.Helper()
	return readPlacements(t, r, true)
}

func readPlacements(t *testing.T, r *scenario.Run, show bool) map[string]scenario.Placement {
	t.Helper()
	pls, err := r.Placements(t.Context())
	if err != nil {
		t.Fatalf("reading placements: %v", err)
	}
	if show {
		r.Show(t.Context(), pls)
	}
	out := map[string]scenario.Placement{}
	for _, pl := range pls {
		out[pl.Pod.Name] = pl
	}
	return out
}

// oneDevice returns the single device of a pod's single claim.
func oneDevice(t *testing.T, pl scenario.Placement) (scenario.Claim, scenario.Device) {
	t.Helper()
	if len(pl.Claims) != 1 || len(pl.Claims[0].Devices) != 1 {
		t.Fatalf("pod %s: want one claim with one device, got %+v", pl.Pod.Name, pl.Claims)
	}
	return pl.Claims[0], pl.Claims[0].Devices[0]
}

func mib(n int64) int64 { return n << 20 }

// envWant is what a container must see for its one device.
type envWant struct {
	mode     string // TESSERA_MODE
	enforced string // TESSERA_ENFORCED
	uuid     string // NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES, TESSERA_UUID
}

// checkEnv asserts the container's environment against the allocation: the
// visible device, Tessera's variables (memory limit in bytes equal to what
// was allocated), the enforcement mode and, in interposer mode, the
// interposer's variables (CUDA_DEVICE_MEMORY_LIMIT_0=<MiB>m, a shared cache
// file of this claim).
func checkEnv(t *testing.T, ns string, pl scenario.Placement, want envWant) {
	t.Helper()
	c, d := oneDevice(t, pl)
	env := pl.Env
	name := pl.Pod.Name
	if len(env) == 0 {
		t.Errorf("%s: the container printed no variables; log: %q", name, pl.Log)
		return
	}
	eq := func(k, v string) {
		t.Helper()
		if got, ok := env[k]; !ok || got != v {
			t.Errorf("%s: %s=%q (set: %v), want %q", name, k, got, ok, v)
		}
	}
	eq("NVIDIA_VISIBLE_DEVICES", want.uuid)
	eq("CUDA_VISIBLE_DEVICES", want.uuid)
	eq("TESSERA_UUID", want.uuid)
	eq("TESSERA_DEVICE", d.Name)
	eq("TESSERA_CLAIM", ns+"/"+c.Name)
	eq("TESSERA_MODE", want.mode)
	eq("TESSERA_ENFORCED", want.enforced)
	if d.Memory == nil {
		t.Errorf("%s: device %s has no allocated memory to compare with", name, d.Name)
	} else {
		eq("TESSERA_MEMORY_LIMIT", fmt.Sprint(d.Memory.Value()))
	}
	checkClaimStatus(t, ns, c, d, env)
	if want.mode == "interposer" {
		eq("CUDA_DEVICE_MEMORY_LIMIT_0", fmt.Sprintf("%dm", d.Memory.Value()>>20))
		if cache := env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]; !strings.HasPrefix(cache, "/run/tessera/"+string(c.UID)+"/") {
			t.Errorf("%s: CUDA_DEVICE_MEMORY_SHARED_CACHE=%q is not in the claim's own directory /run/tessera/%s/", name, cache, c.UID)
		}
	} else {
		for k := range env {
			if strings.HasPrefix(k, "CUDA_DEVICE_MEMORY_LIMIT") || strings.HasPrefix(k, "CUDA_MPS_") || k == "CUDA_DEVICE_MEMORY_SHARED_CACHE" {
				t.Errorf("%s: mode %s but the container has %s=%s", name, want.mode, k, env[k])
			}
		}
	}
}

// cdiSpec reads the plugin's CDI spec of a claim.
type cdiSpec struct {
	Kind           string `json:"kind"`
	ContainerEdits struct {
		Env    []string `json:"env"`
		Mounts []struct {
			HostPath      string `json:"hostPath"`
			ContainerPath string `json:"containerPath"`
		} `json:"mounts"`
	} `json:"containerEdits"`
	Devices []struct {
		Name           string `json:"name"`
		ContainerEdits struct {
			Env    []string `json:"env"`
			Mounts []struct {
				HostPath      string `json:"hostPath"`
				ContainerPath string `json:"containerPath"`
			} `json:"mounts"`
		} `json:"containerEdits"`
	} `json:"devices"`
}

// claimSpecFile returns the claim's CDI spec file in the CDI directory.
func claimSpecFile(t *testing.T, uid types.UID) (string, *cdiSpec) {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(localcluster.CDIRoot, "*"+string(uid)+"*"))
	if len(matches) != 1 {
		t.Fatalf("claim %s: want one CDI spec in %s, found %v", uid, localcluster.CDIRoot, matches)
	}
	b, err := os.ReadFile(matches[0])
	if err != nil {
		t.Fatal(err)
	}
	var s cdiSpec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("CDI spec %s: %v", matches[0], err)
	}
	return matches[0], &s
}

// hostFilesOfClaim returns the node paths that exist because a claim is
// prepared: its CDI spec and the host side of every mount the spec makes
// under the plugin's data directory (the interposer's accounting
// directory), plus anything else under the data directory named after the
// claim (its checkpoint).
func hostFilesOfClaim(t *testing.T, uid types.UID) []string {
	t.Helper()
	spec, s := claimSpecFile(t, uid)
	out := []string{spec}
	add := func(p string) {
		if strings.HasPrefix(p, scenario.PluginDataDir+"/") {
			out = append(out, p)
		}
	}
	for _, m := range s.ContainerEdits.Mounts {
		add(m.HostPath)
	}
	for _, d := range s.Devices {
		for _, m := range d.ContainerEdits.Mounts {
			add(m.HostPath)
		}
	}
	for _, f := range scenario.ClaimFiles(uid) {
		if !strings.HasPrefix(f, localcluster.CDIRoot) {
			out = append(out, f)
		}
	}
	for _, p := range out {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("claim %s is prepared but %s does not exist: %v", uid, p, err)
		}
	}
	t.Logf("claim %s is prepared; on the node: %s", uid, strings.Join(out, ", "))
	return out
}

// checkGone asserts that none of the paths exist any more, allowing 30 s
// for the kubelet to unprepare.
func checkGone(t *testing.T, what string, paths []string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left []string
		for _, p := range paths {
			if _, err := os.Stat(p); err == nil {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: still on the node 30s later: %s", what, strings.Join(left, ", "))
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// cleanupAndCheck deletes the run's pods and checks every claim was
// unprepared, with no file of it left on the node (files, recorded while
// the claims were prepared, must be gone too).
func cleanupAndCheck(t *testing.T, r *scenario.Run, files []string) {
	t.Helper()
	if err := r.Cleanup(t.Context(), 2*time.Minute); err != nil {
		t.Fatalf("unprepare after deleting the pods: %v", err)
	}
	checkGone(t, "after the pods were deleted", files)
}

// shareTemplate is a ResourceClaimTemplate for a memory share of mem, with
// an optional opaque GpuConfig (raw JSON).
func shareTemplate(name, mem, config string) *resourceapi.ResourceClaimTemplate {
	q := resource.MustParse(mem)
	tpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{
				Name: "gpu",
				Exactly: &resourceapi.ExactDeviceRequest{
					DeviceClassName: "gpu.tessera.dev",
					Capacity:        &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": q}},
				},
			}},
		}}},
	}
	if config != "" {
		tpl.Spec.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver:     localcluster.DriverName,
				Parameters: runtime.RawExtension{Raw: []byte(config)},
			}},
		}}
	}
	return tpl
}

// claimPod is a busybox pod with one claim from a template, printing its
// GPU environment and then sleeping.
func claimPod(name, template string) *corev1.Pod {
	p := busyboxPod(name, "sh", "-c", "env | grep -E 'TESSERA|CUDA|NVIDIA' | sort; exec sleep 3600")
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &template}}
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	return p
}

func createTemplate(t *testing.T, ns string, tpl *resourceapi.ResourceClaimTemplate) {
	t.Helper()
	if _, err := cluster.Client.ResourceV1().ResourceClaimTemplates(ns).Create(t.Context(), tpl, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating ResourceClaimTemplate %s: %v", tpl.Name, err)
	}
}

func createPod(t *testing.T, ns string, p *corev1.Pod) {
	t.Helper()
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s: %v", p.Name, err)
	}
}

// podEvents returns the warning events of one pod, one a line.
func podEvents(ctx context.Context, ns, pod string) []corev1.Event {
	evs, err := cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		return nil
	}
	return evs.Items
}

// checkClaimStatus waits for the plugin's entry in the claim's
// status.devices (written in the background after prepare) and checks it
// tells what the container sees: the UUID, the memory limit in bytes and
// the enforcement mode.
func checkClaimStatus(t *testing.T, ns string, c scenario.Claim, d scenario.Device, env map[string]string) {
	t.Helper()
	data, err := claimStatusData(t.Context(), ns, c.Name, d, 20*time.Second)
	if err != nil {
		t.Errorf("claim %s: %v", c.Name, err)
		return
	}
	str := func(k string) string {
		v, ok := data[k]
		if !ok {
			return "<unset>"
		}
		if f, ok := v.(float64); ok {
			return fmt.Sprintf("%.0f", f)
		}
		return fmt.Sprint(v)
	}
	for k, envName := range map[string]string{"uuid": "TESSERA_UUID", "memoryLimitBytes": "TESSERA_MEMORY_LIMIT", "enforcement": "TESSERA_MODE", "enforced": "TESSERA_ENFORCED"} {
		if got := str(k); got != env[envName] {
			t.Errorf("claim %s: status.devices data %s=%s, but the container sees %s=%s", c.Name, k, got, envName, env[envName])
		}
	}
}

// claimStatusData waits for the plugin's entry for device d in the claim's
// status.devices and returns its data.
func claimStatusData(ctx context.Context, ns, claimName string, d scenario.Device, timeout time.Duration) (map[string]any, error) {
	deadline := time.Now().Add(timeout)
	for {
		claim, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, claimName, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		for _, st := range claim.Status.Devices {
			if st.Driver != localcluster.DriverName || st.Device != d.Name || st.Data == nil {
				continue
			}
			if d.ShareID != "" && (st.ShareID == nil || *st.ShareID != d.ShareID) {
				continue
			}
			var data map[string]any
			if err := json.Unmarshal(st.Data.Raw, &data); err != nil {
				return nil, err
			}
			return data, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the plugin wrote no status.devices entry with data for device %s within %s (status.devices: %+v)", d.Name, timeout, claim.Status.Devices)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
