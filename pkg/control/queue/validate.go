package queue

import (
	"fmt"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// Validate checks a queue against the others (existing queues, the queue
// itself excluded or not): accounted resource names, quota not above limit,
// no negative amounts, a parent that exists and no parent cycle. It returns
// one message per problem; nil means valid. The validating webhook and the
// tests use it; the schema repeats what CEL can check.
func Validate(q *v1alpha1.Queue, others []*v1alpha1.Queue) []string {
	var errs []string
	for name, res := range q.Spec.Resources {
		if name != v1alpha1.ResourceGPUMemory && name != v1alpha1.ResourceGPUs {
			errs = append(errs, fmt.Sprintf("spec.resources: %q is not an accounted resource (use %s or %s)", name, v1alpha1.ResourceGPUMemory, v1alpha1.ResourceGPUs))
			continue
		}
		if res.Quota != nil && res.Quota.Sign() < 0 {
			errs = append(errs, fmt.Sprintf("spec.resources[%s].quota: %s must not be negative", name, res.Quota.String()))
		}
		if res.Limit != nil && res.Limit.Sign() < 0 {
			errs = append(errs, fmt.Sprintf("spec.resources[%s].limit: %s must not be negative", name, res.Limit.String()))
		}
		if res.Quota != nil && res.Limit != nil && res.Quota.Cmp(*res.Limit) > 0 {
			errs = append(errs, fmt.Sprintf("spec.resources[%s]: quota %s is above limit %s", name, res.Quota.String(), res.Limit.String()))
		}
		if res.OverQuotaWeight != nil && *res.OverQuotaWeight < 0 {
			errs = append(errs, fmt.Sprintf("spec.resources[%s].overQuotaWeight: %d must not be negative", name, *res.OverQuotaWeight))
		}
	}
	if p := q.Spec.Parent; p != "" {
		parents := map[string]string{}
		for _, o := range others {
			parents[o.Name] = o.Spec.Parent
		}
		parents[q.Name] = p
		switch {
		case p == q.Name:
			errs = append(errs, fmt.Sprintf("spec.parent: queue %s cannot be its own parent", q.Name))
		case !has(others, p):
			errs = append(errs, fmt.Sprintf("spec.parent: queue %q does not exist; create it first", p))
		case onCycle(q.Name, parents):
			errs = append(errs, fmt.Sprintf("spec.parent: %s would make a cycle (%s)", p, cycleString(q.Name, parents)))
		}
	}
	return errs
}

func has(qs []*v1alpha1.Queue, name string) bool {
	for _, q := range qs {
		if q.Name == name {
			return true
		}
	}
	return false
}

// Children returns the names of the queues naming q as parent.
func Children(name string, all []*v1alpha1.Queue) []string {
	var out []string
	for _, o := range all {
		if o.Spec.Parent == name && o.Name != name {
			out = append(out, o.Name)
		}
	}
	return out
}
