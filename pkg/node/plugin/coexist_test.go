package plugin

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-dev/tessera/pkg/node/coexist"
	"github.com/tessera-dev/tessera/test/testutil"
)

// TestCoexistenceWithTheDevicePlugin: on a node whose allocatable has
// nvidia.com/gpu, the plugin publishes none of its GPUs and records a
// Warning Event on the Node; --allow-shared-gpus publishes them anyway.
func TestCoexistenceWithTheDevicePlugin(t *testing.T) {
	for _, allow := range []bool{false, true} {
		t.Run(map[bool]string{false: "refused", true: "allowed"}[allow], func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			opts := nodeOptions(tempDir(t), "t4:2", false, nil)
			opts.AllowSharedGPUs = allow
			node := nodeObject()
			node.Status.Allocatable = corev1.ResourceList{coexist.DevicePluginResource: resource.MustParse("2")}
			h := startHarnessWith(t, ctx, opts, newFakeClient(node))
			testutil.EventuallyTrue(t, 10*time.Second, "published slices", func() bool { return len(h.publishedSlices()) > 0 })
			devices := h.publishedDevices()
			if allow && len(devices) != 2 {
				t.Fatalf("published %v, want both GPUs with --allow-shared-gpus", devices)
			}
			if !allow && len(devices) != 0 {
				t.Fatalf("published %v next to the device plugin", devices)
			}
			events, err := h.client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, e := range events.Items {
				if e.Reason == coexist.EventReason && e.InvolvedObject.Name == testNode {
					n++
				}
			}
			if n != 2 {
				t.Fatalf("%d %s Events on the Node, want one per GPU", n, coexist.EventReason)
			}
		})
	}
}
