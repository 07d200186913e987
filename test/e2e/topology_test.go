//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/test/localcluster"
)

const nicDriver = "nic.example.com"

// nicPlugin stands in for a NIC vendor's kubelet plugin: it prepares the
// nic.example.com devices of a claim with nothing to inject, so that the
// pod of demo/topology starts.
type nicPlugin struct{ t *testing.T }

func (p nicPlugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		var devs []kubeletplugin.Device
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == nicDriver {
				devs = append(devs, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device})
			}
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

func (p nicPlugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

func (nicPlugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func (p nicPlugin) HandleError(_ context.Context, err error, msg string) {
	p.t.Logf("nic plugin: %s: %v", msg, err)
}

// TestTopologyDemo runs demo/topology: an administrator's ResourceSlice of
// a NIC-like driver with resource.kubernetes.io/pcieRoot values, and a
// claim for a GPU share and a NIC with matchAttribute on that attribute.
// The scheduler allocates nic-0 (nic-1's root has no GPU) and a share of
// a GPU behind nic-0's root (gpu-2 or gpu-3 of the mock's t4:4, root
// pci0000:20); a stand-in NIC kubelet plugin lets the pod start.
func TestTopologyDemo(t *testing.T) {
	usePlugin(t, localcluster.PluginConfig{Profile: "t4:4"})
	ctx := t.Context()
	dataDir := filepath.Join(localcluster.KubeletRootDir, "plugins", nicDriver)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dataDir) })
	helper, err := kubeletplugin.Start(ctx, nicPlugin{t},
		kubeletplugin.DriverName(nicDriver),
		kubeletplugin.KubeClient(cluster.Client),
		kubeletplugin.NodeName(localcluster.NodeName),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(localcluster.KubeletRootDir, "plugins_registry")),
		kubeletplugin.PluginDataDirectoryPath(dataDir))
	if err != nil {
		t.Fatalf("the stand-in NIC kubelet plugin: %v", err)
	}
	t.Cleanup(helper.Stop)

	dir := filepath.Join(cluster.Opts.RepoRoot, "demo", "topology")
	nic, err := os.ReadFile(filepath.Join(dir, "10-nic.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	applyYAML(t, string(nic))
	ns := newNamespace(t)
	if out, err := cluster.Kubectl(ctx, "apply", "-n", ns, "-f", filepath.Join(dir, "20-aligned.yaml")); err != nil {
		t.Fatalf("applying 20-aligned.yaml: %v: %s", err, out)
	}
	pod := waitPodPhase(t, ns, "aligned", corev1.PodRunning, 2*time.Minute)
	t.Logf("pod aligned runs on %s:\n%s", pod.Spec.NodeName, podLogs(t, ns, "aligned"))

	claim, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, "gpu-near-nic", metav1.GetOptions{})
	if err != nil || claim.Status.Allocation == nil {
		t.Fatalf("claim gpu-near-nic: %v, allocation %v", err, claim)
	}
	got := map[string]resourceapi.DeviceRequestAllocationResult{}
	for _, r := range claim.Status.Allocation.Devices.Results {
		got[r.Request] = r
	}
	gpu, nicRes := got["gpu"], got["nic"]
	if nicRes.Driver != nicDriver || nicRes.Device != "nic-0" {
		t.Errorf("request nic got %s/%s, want %s/nic-0 (the only NIC behind a GPU's root)", nicRes.Driver, nicRes.Device, nicDriver)
	}
	root := pcieRootOf(t, ctx, gpu)
	t.Logf("allocated: gpu %s/%s/%s (pcieRoot %s), nic %s/%s", gpu.Driver, gpu.Pool, gpu.Device, root, nicRes.Pool, nicRes.Device)
	behindNIC := strings.HasPrefix(gpu.Device, "gpu-2") || strings.HasPrefix(gpu.Device, "gpu-3")
	if gpu.Driver != devicemodel.DriverName || root != "pci0000:20" || !behindNIC {
		t.Errorf("request gpu got %s/%s with pcieRoot %q, want a share of gpu-2 or gpu-3 (pci0000:20, nic-0's root)", gpu.Driver, gpu.Device, root)
	}

	// Both drivers unprepare when the pod goes.
	grace := int64(0)
	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, "aligned", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "pod aligned gone", func(ctx context.Context) (bool, error) {
		_, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "aligned", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err := cluster.WaitClaimsUnprepared(ctx, time.Minute); err != nil {
		t.Error(err)
	}
}

// pcieRootOf reads the allocated device's resource.kubernetes.io/pcieRoot
// from its driver's ResourceSlices.
func pcieRootOf(t *testing.T, ctx context.Context, r resourceapi.DeviceRequestAllocationResult) string {
	t.Helper()
	slices, err := cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slices.Items {
		if s.Spec.Driver != r.Driver || s.Spec.Pool.Name != r.Pool {
			continue
		}
		for _, d := range s.Spec.Devices {
			if d.Name == r.Device {
				if a, ok := d.Attributes[devicemodel.AttrPCIeRoot]; ok && a.StringValue != nil {
					return *a.StringValue
				}
				return ""
			}
		}
	}
	t.Fatalf("device %s/%s/%s is in no ResourceSlice", r.Driver, r.Pool, r.Device)
	return ""
}
