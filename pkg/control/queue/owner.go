package queue

import (
	"fmt"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// Owner says which controller decides a queue's pods (canary queues: see
// v1alpha1.QueueSpec.ControllerName).
type Owner struct {
	// Controller is the deciding controller's name: the root queue's
	// spec.controllerName, v1alpha1.DefaultControllerName when empty.
	Controller string
	// Root is the queue whose spec.controllerName counts: the topmost
	// existing ancestor (the queue itself for a top-level queue). Empty
	// when the queue is on a parent cycle; such a tree goes to the main
	// controller, which reports it invalid.
	Root string
	// Refused, when set, says why the queue's own spec.controllerName was
	// not followed (it differs from its root's).
	Refused string
}

// ControllerOf is the controller a spec.controllerName names.
func ControllerOf(name string) string {
	if name == "" {
		return v1alpha1.DefaultControllerName
	}
	return name
}

// Owners says which controller decides each queue. A queue's whole tree
// goes to its root's controller: a parent's fair share and limits are
// computed over all its children, which only one controller sees whole,
// so a child that names another controller is refused (Owner.Refused
// says why and how to fix it) and stays with its root's.
func Owners(queues []*v1alpha1.Queue) map[string]Owner {
	tree := NewTree(queues)
	byName := make(map[string]*v1alpha1.Queue, len(queues))
	parents := make(map[string]string, len(queues))
	for _, q := range queues {
		byName[q.Name], parents[q.Name] = q, q.Spec.Parent
	}
	out := make(map[string]Owner, len(queues))
	for _, q := range queues {
		top := tree.Queues[q.Name]
		for top.Parent != nil {
			top = top.Parent
		}
		// NewTree keeps a queue with a missing parent as a root (its tree
		// starts there) and so a queue on a parent cycle: that tree goes to
		// the main controller.
		if onCycle(top.Name, parents) {
			out[q.Name] = Owner{Controller: v1alpha1.DefaultControllerName}
			continue
		}
		root := byName[top.Name]
		o := Owner{Controller: ControllerOf(root.Spec.ControllerName), Root: root.Name}
		if want := ControllerOf(q.Spec.ControllerName); root != q && q.Spec.ControllerName != "" && want != o.Controller {
			o.Refused = fmt.Sprintf("spec.controllerName %q is not followed: queue %s is decided by controller %q, its root queue %s's, "+
				"so that %s's fair share and limits stay whole; to move the tree, set spec.controllerName on %s; "+
				"otherwise remove it here (a child follows its root)",
				q.Spec.ControllerName, q.Name, o.Controller, root.Name, root.Name, root.Name)
		}
		out[q.Name] = o
	}
	return out
}
