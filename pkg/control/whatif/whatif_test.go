package whatif

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/snapshot"
)

// cluster: node n1 with one H100 (80GB), queue team-a limited to 50Gi of
// GPU memory, two gated pods of team-a asking 30Gi each (a then b).
func cluster(t *testing.T) *decide.Snapshot {
	t.Helper()
	slices, err := decidetest.NodeSlices("n1", decidetest.NodeOptions{Profile: "h100-80gb:1"})
	if err != nil {
		t.Fatal(err)
	}
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Second))
	return &decide.Snapshot{
		Queues:    []*v1alpha1.Queue{decidetest.Queue("team-a", "", "50Gi", "50Gi")},
		Templates: []*resourceapi.ResourceClaimTemplate{decidetest.Template("ns", "gpu30", decidetest.Request{Memory: "30Gi"})},
		Pods: []*corev1.Pod{
			decidetest.Pod("ns", "a", decidetest.PodOptions{Queue: "team-a", Templates: []string{"gpu30"}, Gated: true, Created: t0}),
			decidetest.Pod("ns", "b", decidetest.PodOptions{Queue: "team-a", Templates: []string{"gpu30"}, Gated: true, Created: t1}),
		},
		Slices:  slices,
		Classes: decidetest.Classes(),
		Nodes:   []*corev1.Node{decidetest.Node("n1")},
	}
}

func TestMoreQuotaStartsGatedPod(t *testing.T) {
	ctx := context.Background()
	s := cluster(t)
	c, err := Run(ctx, s, decide.DefaultConfig(), Change{Queues: []*v1alpha1.Queue{decidetest.Queue("team-a", "", "70Gi", "70Gi")}})
	if err != nil {
		t.Fatal(err)
	}
	if o := c.Before.Outcomes["ns/a"]; o.What != Start {
		t.Errorf("before: ns/a %+v, want start", o)
	}
	if o := c.Before.Outcomes["ns/b"]; o.What != Wait || o.Reason != decide.ReasonQueueLimit {
		t.Errorf("before: ns/b %+v, want wait QueueLimit", o)
	}
	if o := c.After.Outcomes["ns/b"]; o.What != Start {
		t.Errorf("after: ns/b %+v, want start", o)
	}
	moved := c.Changed()
	if len(moved) != 1 || moved[0].Workload != "ns/b" {
		t.Fatalf("changed %+v, want only ns/b", moved)
	}
	var out bytes.Buffer
	c.Print(&out, false)
	for _, want := range []string{"team-a", "1/1/0", "2/0/0", "ns/b", "waits (QueueLimit) -> starts"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	// The input state is untouched.
	if s.Queues[0].Spec.Resources[v1alpha1.ResourceGPUMemory].Limit.String() != "50Gi" {
		t.Error("the change modified the input state")
	}
}

func TestRemovingNodeMakesPodsWait(t *testing.T) {
	ctx := context.Background()
	c, err := Run(ctx, cluster(t), decide.DefaultConfig(), Change{RemoveNodes: []string{"n1"}})
	if err != nil {
		t.Fatal(err)
	}
	if o := c.Before.Outcomes["ns/a"]; o.What != Start {
		t.Errorf("before: ns/a %+v, want start", o)
	}
	if o := c.After.Outcomes["ns/a"]; o.What != Wait {
		t.Errorf("after: ns/a %+v, want wait", o)
	}
	if _, err := Run(ctx, cluster(t), decide.DefaultConfig(), Change{RemoveNodes: []string{"nope"}}); err == nil || !strings.Contains(err.Error(), "no such node") {
		t.Errorf("removing an unknown node: %v", err)
	}
}

func TestAddedNodes(t *testing.T) {
	ctx := context.Background()
	s := cluster(t)
	s.Nodes, s.Slices = nil, nil
	// The slices of a mock node, as the plugin makes them.
	slicer := func(_ context.Context, profile, node string) ([]*resourceapi.ResourceSlice, error) {
		return decidetest.NodeSlices(node, decidetest.NodeOptions{Profile: profile})
	}
	groups := []NodeGroup{{Count: 1, Profile: "h100-80gb:1"}}
	c, err := Run(ctx, s, decide.DefaultConfig(), Change{AddNodes: groups, NodeSlices: slicer})
	if err != nil {
		t.Fatal(err)
	}
	if o := c.Before.Outcomes["ns/a"]; o.What != Wait {
		t.Errorf("before (no nodes): ns/a %+v, want wait", o)
	}
	if o := c.After.Outcomes["ns/a"]; o.What != Start {
		t.Errorf("after adding a node: ns/a %+v, want start", o)
	}
	changed, _, err := Change{AddNodes: groups, NodeSlices: slicer}.Apply(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if len(changed.Slices) == 0 || len(changed.Nodes) != 1 || changed.Nodes[0].Name != "whatif-h100-80gb-1-0" {
		t.Errorf("added %d slices on %d nodes, want some on whatif-h100-80gb-1-0", len(changed.Slices), len(changed.Nodes))
	}
	if _, _, err := (Change{AddNodes: groups}).Apply(ctx, s); err == nil {
		t.Error("adding nodes without a NodeSlicer did not fail")
	}
}

func TestControllerFlags(t *testing.T) {
	cfg, err := ParseControllerFlags("--reclaim=false --max-reclaims-per-cycle=3", decide.DefaultConfig())
	if err != nil || cfg.Reclaim || cfg.MaxReclaimsPerCycle != 3 {
		t.Errorf("got %+v, %v", cfg, err)
	}
	if _, err := ParseControllerFlags("--pin-nodes=none", decide.DefaultConfig()); err == nil || !strings.Contains(err.Error(), "pin-nodes") {
		t.Errorf("a flag that does not change decisions: %v", err)
	}
}

// The snapshot read from the API (a fake client here) saves and loads back
// to the same decisions.
func TestSnapshotRoundTrip(t *testing.T) {
	ctx := context.Background()
	s := cluster(t)
	var objs []client.Object
	for _, o := range snapshot.Objects(s) {
		o.SetResourceVersion("")
		objs = append(objs, o)
	}
	c := fake.NewClientBuilder().WithScheme(snapshot.Scheme()).WithObjects(objs...).Build()
	read, err := snapshot.Read(ctx, c, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(read.Pods) != 2 || len(read.Queues) != 1 || len(read.Slices) != len(s.Slices) || len(read.Classes) != len(s.Classes) {
		t.Fatalf("read %d pods, %d queues, %d slices, %d classes", len(read.Pods), len(read.Queues), len(read.Slices), len(read.Classes))
	}
	var buf bytes.Buffer
	if err := snapshot.Write(&buf, read); err != nil {
		t.Fatal(err)
	}
	loaded, err := snapshot.Load(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(snapshot.Objects(loaded)) != len(snapshot.Objects(read)) {
		t.Fatalf("loaded %d objects, saved %d", len(snapshot.Objects(loaded)), len(snapshot.Objects(read)))
	}
	a, err := Decide(ctx, read, decide.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	b, err := Decide(ctx, loaded, decide.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for k, o := range a.Outcomes {
		if b.Outcomes[k].What != o.What || b.Outcomes[k].Reason != o.Reason {
			t.Errorf("%s: live %+v, loaded %+v", k, o, b.Outcomes[k])
		}
	}
}
