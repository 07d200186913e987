// Package coexist finds GPUs of this node that something else already
// hands out: the NVIDIA device plugin (nvidia.com/gpu in the Node's
// allocatable) or another DRA driver (a ResourceSlice of this node from a
// different driver with a device whose uuid or parentUUID attribute names
// the GPU). Publishing such a GPU as well would let two schedulers give it
// to two pods that each believe they have it.
package coexist

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
)

// DevicePluginResource is what NVIDIA's device plugin advertises.
const DevicePluginResource corev1.ResourceName = "nvidia.com/gpu"

// EventReason is the reason of the Event on the Node.
const EventReason = "GPUAlreadyAdvertised"

// Conflicts returns, per GPU UUID, why another component already
// advertises it. driverName is this driver (its own slices are ignored).
func Conflicts(ctx context.Context, client kubernetes.Interface, nodeName, driverName string, gpus []inventory.GPU) (map[string]string, error) {
	out := map[string]string{}
	node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get Node %s: %w", nodeName, err)
	}
	if q, ok := node.Status.Allocatable[DevicePluginResource]; ok && !q.IsZero() {
		// The device plugin does not say which GPUs; it serves them all.
		for _, g := range gpus {
			out[g.UUID] = fmt.Sprintf("the node advertises %s=%s in its allocatable (the NVIDIA device plugin serves its GPUs)", DevicePluginResource, q.String())
		}
	}
	slices, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	byUUID := map[string]bool{}
	for _, g := range gpus {
		byUUID[g.UUID] = true
	}
	for _, s := range slices.Items {
		if s.Spec.Driver == driverName || !onNode(s, nodeName) {
			continue
		}
		for _, d := range s.Spec.Devices {
			for _, uuid := range deviceUUIDs(d) {
				if byUUID[uuid] {
					if _, seen := out[uuid]; !seen {
						out[uuid] = fmt.Sprintf("DRA driver %s publishes it as device %s in ResourceSlice %s", s.Spec.Driver, d.Name, s.Name)
					}
				}
			}
		}
	}
	return out, nil
}

func onNode(s resourceapi.ResourceSlice, nodeName string) bool {
	return s.Spec.NodeName != nil && *s.Spec.NodeName == nodeName
}

// deviceUUIDs are the GPU UUIDs a device of any driver names: attributes
// called uuid or parentUUID in any domain (NVIDIA's DRA driver:
// gpu.nvidia.com/uuid, parentUUID on MIG devices).
func deviceUUIDs(d resourceapi.Device) []string {
	var out []string
	for name, a := range d.Attributes {
		n := string(name)
		if i := strings.LastIndex(n, "/"); i >= 0 {
			n = n[i+1:]
		}
		if (strings.EqualFold(n, "uuid") || strings.EqualFold(n, "parentUUID")) && a.StringValue != nil {
			out = append(out, *a.StringValue)
		}
	}
	return out
}

// Report logs each conflict and records a Warning Event on the Node.
// allowed says --allow-shared-gpus is set (the GPUs are published anyway).
func Report(ctx context.Context, client kubernetes.Interface, nodeName, component string, conflicts map[string]string, allowed bool) {
	logger := klog.FromContext(ctx)
	if len(conflicts) == 0 {
		return
	}
	node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		logger.Error(err, "Could not get the Node to record an Event")
	}
	i := 0
	for uuid, why := range conflicts {
		i++
		var msg string
		if allowed {
			msg = fmt.Sprintf("GPU %s is published by Tessera although %s (--allow-shared-gpus)", uuid, why)
		} else {
			msg = fmt.Sprintf("GPU %s is not published by Tessera: %s. Remove the other component from this node (docs/install.md) or set --allow-shared-gpus", uuid, why)
		}
		logger.Info(msg, "gpu", uuid)
		if node == nil {
			continue
		}
		now := metav1.NewTime(time.Now())
		ev := &corev1.Event{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x.%d", nodeName, now.UnixNano(), i), Namespace: metav1.NamespaceDefault},
			InvolvedObject: corev1.ObjectReference{
				Kind: "Node", Name: node.Name, UID: node.UID, APIVersion: "v1",
			},
			Reason: EventReason, Message: msg, Type: corev1.EventTypeWarning,
			Source:         corev1.EventSource{Component: component, Host: nodeName},
			FirstTimestamp: now, LastTimestamp: now, Count: 1,
			ReportingController: component, ReportingInstance: nodeName,
		}
		if _, err := client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
			logger.Error(err, "Could not record an Event on the Node", "gpu", uuid)
		}
	}
}
