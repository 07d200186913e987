package queue

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// MemoryQueue is a Queue under parent ("" for a root) with a GPU memory
// quota and limit in Kubernetes quantities ("" = unset; both unset: no
// resources listed), for tools and tests that build queues in code (the
// simulator, the decision engine's fixtures). It panics on a malformed
// quantity: its callers pass constants.
func MemoryQueue(name, parent, memQuota, memLimit string) *v1alpha1.Queue {
	q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.QueueSpec{Parent: parent}}
	if memQuota == "" && memLimit == "" {
		return q
	}
	r := v1alpha1.QueueResource{}
	if memQuota != "" {
		r.Quota = ptr.To(resource.MustParse(memQuota))
	}
	if memLimit != "" {
		r.Limit = ptr.To(resource.MustParse(memLimit))
	}
	q.Spec.Resources = map[v1alpha1.ResourceName]v1alpha1.QueueResource{v1alpha1.ResourceGPUMemory: r}
	return q
}
