package plugin

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/node/nvmlsource"
)

const (
	testNode = "node-1"
	gib      = int64(1) << 30
)

// nodeOptions are the plugin options of a test node under dir: mock GPUs
// of the profile, every directory a temp one.
func nodeOptions(dir, profile string, mig bool, timeSlices map[string]int) *Options {
	o := &Options{
		NodeName:       testNode,
		Backend:        nvmlsource.Options{Kind: nvmlsource.Mock, MockProfile: profile, MockMIG: "none"},
		ReservedMemory: "256Mi",
		MIGMode:        string(devicemodel.MIGDynamic),
		RescanInterval: time.Minute,
		CDIRoot:        filepath.Join(dir, "cdi"),
		PluginDataDir:  filepath.Join(dir, "plugin"),
		RegistrarDir:   filepath.Join(dir, "registry"),
		MockDeviceRoot: filepath.Join(dir, "dev"),
		NvidiaSMI:      "nvidia-smi",
		BootIDPath:     filepath.Join(dir, "boot_id"),
		HealthIgnoredXIDs: []uint{
			13, 31, 43, 45, 68, 109,
		},
	}
	if mig {
		o.Backend.MockMIG = "all"
	}
	if len(timeSlices) > 0 {
		data, _ := json.Marshal(timeSlices)
		o.TimeSlicesConfig = filepath.Join(dir, "time-slices.json")
		_ = os.WriteFile(o.TimeSlicesConfig, data, 0o644)
	}
	_ = os.WriteFile(o.BootIDPath, []byte("boot-1\n"), 0o644)
	return o
}

// tempDir is a short temporary directory: Unix socket paths are limited
// to 108 bytes.
func tempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tsr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// newFakeClient is a fake API server that, like the real one, names
// objects created with generateName (the ResourceSlice controller uses it)
// and keeps the status.devices the plugin writes.
func newFakeClient(objs ...runtime.Object) *fake.Clientset {
	return nameGenerated(fake.NewClientset(objs...))
}

// newLightFakeClient starts much faster: no field management, and status
// writes (status.devices) are accepted without effect.
func newLightFakeClient(objs ...runtime.Object) *fake.Clientset {
	// Not fake.NewClientset: it builds OpenAPI type converters: too slow for a process started hundreds of times.
	client := nameGenerated(fake.NewSimpleClientset(objs...))
	client.PrependReactor("update", "resourceclaims", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "status" {
			return false, nil, nil
		}
		return true, action.(k8stesting.UpdateAction).GetObject(), nil
	})
	return client
}

func nameGenerated(client *fake.Clientset) *fake.Clientset {
	client.PrependReactor("create", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		ca, ok := action.(k8stesting.CreateAction)
		if !ok {
			return false, nil, nil
		}
		if m, err := meta.Accessor(ca.GetObject()); err == nil && m.GetName() == "" && m.GetGenerateName() != "" {
			m.SetName(m.GetGenerateName() + utilrand.String(5))
		}
		return false, nil, nil
	})
	return client
}

func nodeObject() *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "node-uid"}}
}

// harness runs the real plugin in process against a fake API server and
// talks to it as the kubelet does, over its Unix socket.
type harness struct {
	t      testing.TB
	ctx    context.Context
	cancel context.CancelFunc
	opts   *Options
	client *fake.Clientset
	driver *Driver
	conn   *grpc.ClientConn
	dra    drapb.DRAPluginClient
}

func startHarness(t testing.TB, ctx context.Context, opts *Options, claims ...*resourceapi.ResourceClaim) *harness {
	t.Helper()
	objs := []runtime.Object{nodeObject()}
	for _, c := range claims {
		objs = append(objs, c)
	}
	return startHarnessWith(t, ctx, opts, newFakeClient(objs...))
}

func startHarnessWith(t testing.TB, ctx context.Context, opts *Options, client *fake.Clientset) *harness {
	t.Helper()
	h := &harness{t: t, opts: opts, client: client}
	h.ctx, h.cancel = context.WithCancel(ctx)
	d, err := Start(h.ctx, opts, h.client)
	if err != nil {
		t.Fatal(err)
	}
	h.driver = d
	_, sock := opts.socketPaths()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	h.conn, h.dra = conn, drapb.NewDRAPluginClient(conn)
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	if h.driver == nil {
		return
	}
	_ = h.conn.Close()
	h.cancel()
	h.driver.Stop()
	h.driver = nil
}

func (h *harness) addClaims(claims ...*resourceapi.ResourceClaim) {
	h.t.Helper()
	for _, c := range claims {
		if _, err := h.client.ResourceV1().ResourceClaims(c.Namespace).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
			h.t.Fatal(err)
		}
	}
}

func pbClaims(claims ...*resourceapi.ResourceClaim) []*drapb.Claim {
	var out []*drapb.Claim
	for _, c := range claims {
		out = append(out, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	return out
}

func (h *harness) prepare(claims ...*resourceapi.ResourceClaim) (*drapb.NodePrepareResourcesResponse, error) {
	return h.dra.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: pbClaims(claims...)})
}

func (h *harness) unprepare(claims ...*resourceapi.ResourceClaim) (*drapb.NodeUnprepareResourcesResponse, error) {
	return h.dra.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{Claims: pbClaims(claims...)})
}

// newClaim builds an allocated, reserved claim of the test node.
func newClaim(name string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
		Status: resourceapi.ResourceClaimStatus{
			Allocation:  &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-" + name, UID: types.UID("pod-uid-" + name)}},
		},
	}
}

func shareResult(request, device, shareID string, memory, cores int64) resourceapi.DeviceRequestAllocationResult {
	s := types.UID(shareID)
	return resourceapi.DeviceRequestAllocationResult{
		Request: request, Driver: devicemodel.DriverName, Pool: testNode, Device: device, ShareID: &s,
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
			devicemodel.CapMemory: *resource.NewQuantity(memory, resource.BinarySI),
			devicemodel.CapCores:  *resource.NewQuantity(cores, resource.DecimalSI),
		},
	}
}

func deviceResult(request, device string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: request, Driver: devicemodel.DriverName, Pool: testNode, Device: device}
}

func withGpuConfig(c *resourceapi.ResourceClaim, requests []string, params string) *resourceapi.ResourceClaim {
	c.Status.Allocation.Devices.Config = append(c.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
		Source:   resourceapi.AllocationConfigSourceClaim,
		Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver:     devicemodel.DriverName,
			Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig",` + params + `}`)},
		}},
	})
	return c
}

func dirEntries(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out
}
