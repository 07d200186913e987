package scale

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestReplacedPods checks what a timeout's error says about pods replaced
// for a stale pin: the pod, the controller's reason, and what the API
// shows on the node it was pinned to; other events and nodes are left out.
func TestReplacedPods(t *testing.T) {
	const note = "Stale pin: pinned to node kwok-node-0005, where the scheduler has found no room for 2m0s (...)"
	alloc := func(ns, name, pool, dev string) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{{Pool: pool, Device: dev}}}}}}
	}
	for _, tc := range []struct {
		name   string
		events []*eventsv1.Event
		want   []string
		absent []string
	}{
		{name: "none replaced", events: []*eventsv1.Event{{ObjectMeta: metav1.ObjectMeta{Namespace: "w", Name: "e1"}, Reason: "Admitted", Regarding: corev1.ObjectReference{Name: "p-1"}}}},
		{name: "one replaced",
			events: []*eventsv1.Event{
				{ObjectMeta: metav1.ObjectMeta{Namespace: "w", Name: "e1"}, Reason: "Admitted", Regarding: corev1.ObjectReference{Name: "p-1"}},
				{ObjectMeta: metav1.ObjectMeta{Namespace: "w", Name: "e2"}, Reason: "StalePin", Note: note, Regarding: corev1.ObjectReference{Name: "p-58"}},
			},
			want:   []string{"p-58 replaced: " + note, "node kwok-node-0005: 1 devices allocated in the API [old/c1: gpu-3 (reserved for 0)]", "slices [s5 generation 7, 1 devices]"},
			absent: []string{"p-1", "gpu-4", "s6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset(
				alloc("old", "c1", "kwok-node-0005", "gpu-3"), alloc("old", "c2", "kwok-node-0006", "gpu-4"),
				&resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s5"}, Spec: resourceapi.ResourceSliceSpec{Pool: resourceapi.ResourcePool{Name: "kwok-node-0005", Generation: 7}, Devices: []resourceapi.Device{{Name: "gpu-3"}}}},
				&resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s6"}, Spec: resourceapi.ResourceSliceSpec{Pool: resourceapi.ResourcePool{Name: "kwok-node-0006", Generation: 7}}},
			)
			for _, e := range tc.events {
				if _, err := cs.EventsV1().Events(e.Namespace).Create(context.Background(), e, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			got := (&harness{cs: cs}).replacedPods(context.Background(), "w")
			if len(tc.want) == 0 && got != "" {
				t.Errorf("got %q, want nothing", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("%q lacks %q", got, w)
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(got, a) {
					t.Errorf("%q names %q", got, a)
				}
			}
		})
	}
}
