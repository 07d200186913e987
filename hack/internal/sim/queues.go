package sim

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/tessera-dev/tessera/pkg/control/queue"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/pkg/control/decide"
)

// QueueSpec is one Queue of the controller, with a GPU memory quota and
// limit ("" = unset). Jobs go to the queue named like their kind.
type QueueSpec struct {
	Name         string
	Quota, Limit string
}

// DefaultQueue takes the jobs whose kind names no queue; it has neither
// quota nor limit.
const DefaultQueue = "default"

// ParseQueues parses "<name>=<quota>:<limit>" entries separated by ";",
// e.g. "training=2Ti:3Ti;inference=1Ti:" (either side may be empty).
func ParseQueues(s string) ([]QueueSpec, error) {
	var out []QueueSpec
	for _, part := range strings.Split(s, ";") {
		name, ql, ok := strings.Cut(strings.TrimSpace(part), "=")
		quota, limit, ok2 := strings.Cut(ql, ":")
		if !ok || !ok2 || name == "" {
			return nil, fmt.Errorf("queue %q: use <name>=<quota>:<limit>, e.g. training=2Ti:3Ti (either may be empty)", part)
		}
		for _, q := range []string{quota, limit} {
			if _, err := resource.ParseQuantity(q); q != "" && err != nil {
				return nil, fmt.Errorf("queue %q: %q is not a quantity of GPU memory (e.g. 512Gi, 2Ti)", part, q)
			}
		}
		out = append(out, QueueSpec{Name: name, Quota: quota, Limit: limit})
	}
	return out, nil
}

// admissionResult is what the controller decided about the jobs.
type admissionResult struct {
	// order is the admitted jobs, in the order the controller ungates them.
	order []int
	// held counts jobs a queue holds back (quota or limit).
	held int
	took time.Duration
	// stats are the cycle's own.
	stats decide.Stats
}

// admission is one decision cycle of the controller's decision engine
// over the jobs, each a gated pod labelled for its queue whose claim comes
// from a template, on the simulated nodes' slices.
type admission struct {
	snap  *decide.Snapshot
	index map[string]int
}

func newAdmission(nodes []*simNode, jobs []Job, claims []*resourceapi.ResourceClaim, specs []QueueSpec, classes []*resourceapi.DeviceClass) *admission {
	snap := &decide.Snapshot{Classes: classes}
	known := map[string]bool{}
	for _, q := range specs {
		snap.Queues = append(snap.Queues, queue.MemoryQueue(q.Name, "", q.Quota, q.Limit))
		known[q.Name] = true
	}
	if !known[DefaultQueue] {
		snap.Queues = append(snap.Queues, queue.MemoryQueue(DefaultQueue, "", "", ""))
	}
	for _, n := range nodes {
		snap.Nodes = append(snap.Nodes, nodeObject(n.name))
		snap.Slices = append(snap.Slices, n.alloc.Slices...)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	index := map[string]int{}
	for i, job := range jobs {
		q := job.Kind
		if !known[q] {
			q = DefaultQueue
		}
		name := fmt.Sprintf("job-%05d", i)
		index[name] = i
		snap.Templates = append(snap.Templates, &resourceapi.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Namespace: "sim", Name: name},
			Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: claims[i].Spec},
		})
		snap.Pods = append(snap.Pods, gatedPod("sim", name, q, name, metav1.NewTime(t0.Add(time.Duration(i)*time.Millisecond))))
	}
	return &admission{snap: snap, index: index}
}

// admit runs the cycle from a fresh engine.
func (a *admission) admit(ctx context.Context) (admissionResult, error) {
	return a.admitWith(ctx, decide.NewEngine(decide.DefaultConfig()))
}

// admitWith runs the cycle with the engine, as the controller's next
// cycle would with nothing changed: what the engine reserved for the pods
// in an earlier cycle is forgotten first, so that the decision is the
// same, and what it derived from the slices and classes is kept.
func (a *admission) admitWith(ctx context.Context, e *decide.Engine) (admissionResult, error) {
	snap, index := a.snap, a.index
	e.Forget(snap.Pods...)
	dec, err := e.Decide(ctx, snap)
	if err != nil {
		return admissionResult{}, err
	}
	res := admissionResult{took: dec.Stats.Duration, stats: dec.Stats}
	for _, a := range dec.Admit {
		for _, p := range a.Pods {
			res.order = append(res.order, index[p.Name])
		}
	}
	for _, v := range dec.Waiting {
		if v.Reason == decide.ReasonQueueLimit || v.Reason == decide.ReasonOverQuotaHeld {
			res.held += len(v.Workload.Pods)
		}
	}
	return res, nil
}

// prepareAdmission builds the cluster and the snapshot of one admission
// cycle (benchmarks decide it repeatedly).
func prepareAdmission(ctx context.Context, cl Cluster, jobs []Job, policy Policy) (*admission, error) {
	classes, nodes, claims, err := build(ctx, cl, jobs, policy)
	if err != nil {
		return nil, err
	}
	return newAdmission(nodes, jobs, claims, cl.Queues, classes), nil
}
