//go:build e2e

package e2e

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
	"github.com/tessera-dev/tessera/pkg/node/driverfiles/fixture"
	"github.com/tessera-dev/tessera/test/localcluster"
)

// driverProbe prints, one "key=value" a line, what a CUDA program's loader
// would find: where libcuda.so.1 resolves to, that file's checksum, whether
// the container's ld cache knows it, and whether nvidia-smi is there.
const driverProbe = `lib=/usr/lib/x86_64-linux-gnu
echo "resolved=$(readlink -f $lib/libcuda.so.1 2>/dev/null)"
echo "md5=$(md5sum $lib/libcuda.so.1 2>/dev/null | cut -d' ' -f1)"
echo "ldcache=$(grep -c libcuda.so.1 /etc/ld.so.cache 2>/dev/null || echo 0)"
echo "smi=$(test -x /usr/bin/nvidia-smi && echo yes || echo no)"
`

// TestDriverFilesInEveryClaim: the container of a share, a whole GPU, a
// time slice and a MIG claim each sees libcuda.so.1 where the CUDA runtime
// looks for it, resolving through the hook's symlinks to the fixture
// driver's libcuda.so.<version> (same bytes), the ld cache lists it and
// nvidia-smi is there; a pod without a claim sees none of it.
func TestDriverFilesInEveryClaim(t *testing.T) {
	requireChart(t, "the fixture driver root is wired through the chart (chart install mode)")
	usePlugin(t, localcluster.PluginConfig{Profile: "t4:1,h100-80gb:1", Args: []string{"--mock-mig=all", "--time-slices=2"}})
	v := nvmlmock.DefaultDriverVersion
	want := "/" + fixture.LibDir + "/libcuda.so." + v
	data, err := os.ReadFile(filepath.Join(cluster.Dirs.DriverRoot, want))
	if err != nil {
		t.Fatalf("the fixture driver root: %v", err)
	}
	sum := md5.Sum(data)
	wantMD5 := hex.EncodeToString(sum[:])

	ns := newNamespace(t)
	exact := func(class string) *resourceapi.ResourceClaimTemplate {
		return &resourceapi.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: strings.TrimSuffix(class, ".tessera.dev")},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
				Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}},
			}}},
		}
	}
	whole := exact("gpu.tessera.dev")
	whole.Name = "whole"
	for _, tpl := range []*resourceapi.ResourceClaimTemplate{shareTemplate("share", "1Gi", ""), whole, exact("timeslice.tessera.dev"), exact("mig.tessera.dev")} {
		createTemplate(t, ns, tpl)
	}
	// One pod at a time: the whole GPU excludes the share and the time
	// slices of the same T4.
	for _, kind := range []string{"share", "whole", "timeslice", "mig"} {
		p := busyboxPod("driver-"+kind, "sh", "-c", driverProbe)
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &kind}}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
		createPod(t, ns, p)
		waitPodPhase(t, ns, p.Name, corev1.PodSucceeded, 2*time.Minute)
		got := probeResult(podLogs(t, ns, p.Name))
		if got["resolved"] != want || got["md5"] != wantMD5 || got["ldcache"] == "0" || got["smi"] != "yes" {
			t.Errorf("%s claim's container: %v; want libcuda.so.1 resolving to %s (md5 %s), in the ld cache, and nvidia-smi", kind, got, want, wantMD5)
		}
		if err := cluster.Client.CoreV1().Pods(ns).Delete(t.Context(), p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "pod "+p.Name+" gone", func(ctx context.Context) (bool, error) {
			_, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
	}

	plain := busyboxPod("driver-none", "sh", "-c", driverProbe)
	createPod(t, ns, plain)
	waitPodPhase(t, ns, plain.Name, corev1.PodSucceeded, 2*time.Minute)
	got := probeResult(podLogs(t, ns, plain.Name))
	if got["resolved"] != "" || got["md5"] != "" || got["smi"] != "no" || got["ldcache"] != "0" {
		t.Errorf("a pod without a claim sees driver files: %v", got)
	}
}

func probeResult(logs string) map[string]string {
	out := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(logs), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}
