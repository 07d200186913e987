package controller_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/controller"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
)

// slowClient holds every gate removal for a while and records how many
// were in flight at once.
type slowClient struct {
	client.Client
	mu             sync.Mutex
	inFlight, most int
}

func (s *slowClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	data, err := patch.Data(obj)
	if err != nil {
		return err
	}
	if strings.Contains(string(data), "schedulingGates") {
		s.mu.Lock()
		s.inFlight++
		s.most = max(s.most, s.inFlight)
		s.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
		defer func() { s.mu.Lock(); s.inFlight--; s.mu.Unlock() }()
	}
	return s.Client.Patch(ctx, obj, patch, opts...)
}

// TestUngatesInParallelAcrossWorkloads: single-pod workloads admitted in
// one cycle have their gates removed in parallel (--apply-workers), not
// one workload after the other: at 4,000 pods, one at a time held
// admission to about 20 pods per second.
func TestUngatesInParallelAcrossWorkloads(t *testing.T) {
	e := startEnv(t)
	e.gpuNode("node-1", "h100-80gb:8")
	e.create(decidetest.Queue("team", "", "", ""))
	var names []string
	for i := range 8 {
		n := fmt.Sprintf("single-%d", i)
		e.create(claim(n+"-gpu", decidetest.Request{Memory: "4Gi"}))
		e.create(asNew(decidetest.Pod("default", n, decidetest.PodOptions{Queue: "team", Claims: []string{n + "-gpu"}, Gated: true})))
		names = append(names, n)
	}
	slow := &slowClient{Client: e.c}
	a := &controller.Reconciler{
		Client: slow, Reader: e.c, Recorder: events.NewFakeRecorder(100),
		Engine:  decide.NewEngine(decide.Config{Reclaim: true, MaxReclaimsPerCycle: 16, Features: allocation.SchedulerFeatures}),
		Metrics: controller.NewMetrics(prometheus.NewRegistry()), Opts: e.opts,
	}
	if _, err := a.Reconcile(e.ctx, controller.CycleRequest); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if gated(e.pod(n)) {
			t.Errorf("%s is still gated after the cycle", n)
		}
	}
	if want := min(e.opts.ApplyWorkers, len(names)); slow.most < want {
		t.Errorf("at most %d gate removals were in flight at once, want %d (--apply-workers=%d, %d single-pod workloads)", slow.most, want, e.opts.ApplyWorkers, len(names))
	}
}

// pinnedTo is the node every required node selector term of the pod pins
// it to with matchFields metadata.name, or "".
func pinnedTo(p *corev1.Pod) string {
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	node := ""
	for _, t := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		n := len(t.MatchFields)
		if n == 0 || t.MatchFields[n-1].Key != "metadata.name" || len(t.MatchFields[n-1].Values) != 1 {
			return ""
		}
		if v := t.MatchFields[n-1].Values[0]; node == "" || node == v {
			node = v
		} else {
			return ""
		}
	}
	return node
}
