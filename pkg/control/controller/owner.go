package controller

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/queue"
)

// Canary queues: several controller releases run at once, each deciding
// the trees whose root queue names it in spec.controllerName (the main
// one, v1alpha1.DefaultControllerName, those that name none). A
// controller decides, writes and evicts only for its own queues' pods and
// writes only its own queues' status; the devices the others' pods hold
// still count in its placement.

// ownership says which queues and pods a controller owns.
type ownership struct {
	name   string
	owners map[string]queue.Owner
}

func newOwnership(name string, queues []*v1alpha1.Queue) ownership {
	if name == "" {
		name = v1alpha1.DefaultControllerName
	}
	return ownership{name: name, owners: queue.Owners(queues)}
}

// queue says whether the named queue is this controller's; a queue that
// does not exist is the main controller's (it tells the pods so).
func (o ownership) queue(name string) bool {
	owner, ok := o.owners[name]
	if !ok {
		return o.name == v1alpha1.DefaultControllerName
	}
	return owner.Controller == o.name
}

// pod says whether the pod's queue is this controller's.
func (o ownership) pod(p *corev1.Pod) bool { return o.queue(p.Labels[v1alpha1.QueueLabel]) }

// own narrows a snapshot to what this controller decides: its queues and
// their pods. Admitted pods of other controllers' queues stay in it: the
// devices they hold (or were admitted to, not yet allocated) are taken,
// and with their queue unknown here they are charged to no queue of this
// controller's, never evicted, never written to. Their gated pods go: they
// are the other controller's to decide.
func own(snap *decide.Snapshot, name string) ownership {
	o := newOwnership(name, snap.Queues)
	queues := snap.Queues[:0:0]
	for _, q := range snap.Queues {
		if o.queue(q.Name) {
			queues = append(queues, q)
		}
	}
	pods := snap.Pods[:0:0]
	for _, p := range snap.Pods {
		if o.pod(p) || !decide.HasAdmissionGate(p) {
			pods = append(pods, p)
		}
	}
	snap.Queues, snap.Pods = queues, pods
	return o
}

// assignedCondition is a queue's ControllerAssigned condition: which
// controller decides it, or why its own spec.controllerName was refused.
func assignedCondition(o queue.Owner, generation int64) metav1.Condition {
	c := metav1.Condition{Type: v1alpha1.QueueConditionControllerAssigned, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonControllerAssigned,
		Message: fmt.Sprintf("decided by controller %q (spec.controllerName of root queue %s)", o.Controller, o.Root), ObservedGeneration: generation}
	if o.Root == "" {
		c.Message = fmt.Sprintf("decided by controller %q: the queue is on a parent cycle", o.Controller)
	}
	if o.Refused != "" {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, v1alpha1.ReasonSplitRefused, o.Refused
	}
	return c
}

// recorderName is the event source of a controller: the main one's is
// tessera-controller, a canary's tessera-controller-<name>.
func recorderName(controller string) string {
	if controller == "" || controller == v1alpha1.DefaultControllerName {
		return "tessera-controller"
	}
	return "tessera-controller-" + controller
}
