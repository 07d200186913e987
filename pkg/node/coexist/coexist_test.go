package coexist

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
)

const (
	node   = "node-1"
	driver = "gpu.tessera.dev"
)

var gpus = []inventory.GPU{{UUID: "GPU-a"}, {UUID: "GPU-b"}}

func nodeWith(allocatable corev1.ResourceList) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}, Status: corev1.NodeStatus{Allocatable: allocatable}}
}

func slice(name, drv, nodeName string, attrs map[resourceapi.QualifiedName]string) *resourceapi.ResourceSlice {
	a := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	for k, v := range attrs {
		a[k] = resourceapi.DeviceAttribute{StringValue: ptr.To(v)}
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: drv, NodeName: ptr.To(nodeName), Pool: resourceapi.ResourcePool{Name: nodeName, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "gpu-0", Attributes: a}},
		},
	}
}

func TestConflicts(t *testing.T) {
	for _, tc := range []struct {
		name string
		objs []runtime.Object
		want map[string]string // uuid -> substring of the reason
	}{
		{name: "nothing else", objs: []runtime.Object{nodeWith(nil)}, want: map[string]string{}},
		{name: "device plugin advertises nvidia.com/gpu", objs: []runtime.Object{nodeWith(corev1.ResourceList{DevicePluginResource: resource.MustParse("2")})},
			want: map[string]string{"GPU-a": "nvidia.com/gpu=2", "GPU-b": "nvidia.com/gpu=2"}},
		{name: "zero nvidia.com/gpu is no conflict", objs: []runtime.Object{nodeWith(corev1.ResourceList{DevicePluginResource: resource.MustParse("0")})}, want: map[string]string{}},
		{name: "NVIDIA's DRA driver publishes GPU-b", objs: []runtime.Object{nodeWith(nil),
			slice("nv", "gpu.nvidia.com", node, map[resourceapi.QualifiedName]string{"uuid": "GPU-b"})},
			want: map[string]string{"GPU-b": "DRA driver gpu.nvidia.com publishes it as device gpu-0 in ResourceSlice nv"}},
		{name: "a MIG device's parentUUID in a qualified attribute", objs: []runtime.Object{nodeWith(nil),
			slice("nv", "gpu.nvidia.com", node, map[resourceapi.QualifiedName]string{"gpu.nvidia.com/parentUUID": "GPU-a", "uuid": "MIG-x"})},
			want: map[string]string{"GPU-a": "gpu.nvidia.com"}},
		{name: "own slices, other nodes and other UUIDs are ignored", objs: []runtime.Object{nodeWith(nil),
			slice("own", driver, node, map[resourceapi.QualifiedName]string{"uuid": "GPU-a"}),
			slice("other-node", "gpu.nvidia.com", "node-2", map[resourceapi.QualifiedName]string{"uuid": "GPU-a"}),
			slice("other-gpu", "gpu.nvidia.com", node, map[resourceapi.QualifiedName]string{"uuid": "GPU-z"})},
			want: map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			got, err := Conflicts(ctx, fake.NewClientset(tc.objs...), node, driver, gpus)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("conflicts %v, want %v", got, tc.want)
			}
			for uuid, sub := range tc.want {
				if !strings.Contains(got[uuid], sub) {
					t.Errorf("%s: reason %q, want it to contain %q", uuid, got[uuid], sub)
				}
			}
		})
	}
	t.Run("no Node is an error", func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		if _, err := Conflicts(ctx, fake.NewClientset(), node, driver, gpus); err == nil || !strings.Contains(err.Error(), "get Node node-1") {
			t.Fatalf("error %v", err)
		}
	})
}

func TestReportRecordsEventsOnTheNode(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset(nodeWith(nil))
	Report(ctx, client, node, "tessera-kubelet-plugin", map[string]string{"GPU-a": "x", "GPU-b": "y"}, false)
	events, err := client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(events.Items) != 2 {
		t.Fatalf("%d events, want 2", len(events.Items))
	}
	for _, e := range events.Items {
		if e.InvolvedObject.Kind != "Node" || e.InvolvedObject.Name != node || e.InvolvedObject.UID != "node-uid" ||
			e.Reason != EventReason || e.Type != corev1.EventTypeWarning || !strings.Contains(e.Message, "--allow-shared-gpus") {
			t.Errorf("event %+v", e)
		}
	}
}
