package decide

// ReasonNamespaceNotSelected: the pod's queue does not take pods of its
// namespace (spec.namespaceSelector) at the time of the decision.
const ReasonNamespaceNotSelected = "NamespaceNotSelected"

// checkNamespaces makes pending workloads wait while their queue's
// namespaceSelector does not take their namespace. The webhook checks the
// selector when a pod is created, but a pod may name a queue that does not
// exist yet, or one whose selector the administrator narrows while the pod
// waits: the rule is the queue's rule now, not at creation. A namespace the
// snapshot does not hold (the cache lags behind) is not taken either.
// Workloads that already run are not evicted for it: like a lowered limit,
// a narrowed selector stops new admissions and leaves what runs charged
// to the queue that admitted it (docs/controller.md).
func (c *cycle) checkNamespaces(pending []*Workload) {
	for _, w := range pending {
		if w.problem != "" || w.wait != "" || w.leaf == nil {
			continue
		}
		ns, known := c.namespaces[w.Namespace]
		switch msg := w.leaf.RefusesNamespace(w.Namespace, ns); {
		case msg != "" && !known:
			w.wait = "namespace " + w.Namespace + " is not known to the controller yet: " + msg
		case msg != "":
			w.wait = w.Describe() + ": " + msg
		default:
			continue
		}
		w.waitWhy = ReasonNamespaceNotSelected
	}
}
