package sim

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// The API objects a replay puts behind the controller's admission: queues,
// ready nodes and gated pods labelled for their queue.

// nodeObject is a ready, schedulable Node.
func nodeObject(name string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}
}

// gatedPod is a pod held by the admission gate, labelled for the queue,
// whose one claim comes from the template.
func gatedPod(ns, name, queue, template string, created metav1.Time) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(fmt.Sprintf("uid-pod-%s-%s", ns, name)),
			Labels: map[string]string{v1alpha1.QueueLabel: queue}, CreationTimestamp: created},
		Spec: corev1.PodSpec{
			Containers:      []corev1.Container{{Name: "c", Image: "busybox"}},
			Priority:        ptr.To[int32](0),
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "t0", ResourceClaimTemplateName: ptr.To(template)}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: v1alpha1.AdmissionGate}},
		},
	}
}
