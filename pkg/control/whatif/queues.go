package whatif

import (
	"fmt"
	"io"
	"sort"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/snapshot"
)

// ReadQueues reads Queue objects (a YAML stream or List) for a change.
func ReadQueues(r io.Reader) ([]*v1alpha1.Queue, error) {
	objs, err := snapshot.Decode(r)
	if err != nil {
		return nil, err
	}
	var out []*v1alpha1.Queue
	for _, o := range objs {
		q, ok := o.(*v1alpha1.Queue)
		if !ok {
			return nil, fmt.Errorf("%s is not a Queue", o.GetObjectKind().GroupVersionKind().Kind)
		}
		out = append(out, q)
	}
	return out, nil
}

// WithQueues returns the queues with the given ones replacing those of the
// same name, and added where new; sorted by name.
func WithQueues(current, changed []*v1alpha1.Queue) []*v1alpha1.Queue {
	byName := map[string]*v1alpha1.Queue{}
	for _, q := range current {
		byName[q.Name] = q
	}
	for _, q := range changed {
		c := q.DeepCopy()
		if old, ok := byName[q.Name]; ok {
			// The status (what the queue holds) stays the cluster's.
			c.Status = *old.Status.DeepCopy()
			c.UID = old.UID
		}
		byName[q.Name] = c
	}
	out := make([]*v1alpha1.Queue, 0, len(byName))
	for _, q := range byName {
		out = append(out, q)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
