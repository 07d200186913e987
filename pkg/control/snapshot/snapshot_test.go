package snapshot

import (
	"bytes"
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
)

// Read lists what a cycle decides on (pods only where labelled with a
// queue), Write and Load keep every object, and Load refuses kinds that
// are not part of a snapshot, naming them.
func TestReadWriteLoad(t *testing.T) {
	ctx := context.Background()
	slices, err := decidetest.NodeSlices("n1", decidetest.NodeOptions{Profile: "t4:1"})
	if err != nil {
		t.Fatal(err)
	}
	s := &decide.Snapshot{
		Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}},
		Queues:     []*v1alpha1.Queue{decidetest.Queue("team-a", "", "8Gi", "8Gi")},
		Templates:  []*resourceapi.ResourceClaimTemplate{decidetest.Template("ns", "gpu4", decidetest.Request{Memory: "4Gi"})},
		Pods: []*corev1.Pod{
			decidetest.Pod("ns", "queued", decidetest.PodOptions{Queue: "team-a", Templates: []string{"gpu4"}, Gated: true}),
			decidetest.Pod("ns", "unqueued", decidetest.PodOptions{Templates: []string{"gpu4"}}),
		},
		Slices: slices, Classes: decidetest.Classes(), Nodes: []*corev1.Node{decidetest.Node("n1")},
	}
	var objs []client.Object
	for _, o := range Objects(s) {
		o.SetResourceVersion("")
		objs = append(objs, o)
	}
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(objs...).Build()
	read, err := Read(ctx, c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(read.Pods) != 1 || read.Pods[0].Name != "queued" {
		t.Errorf("read pods %v, want only the queued one", names(read.Pods))
	}
	if read.TaintRules == nil {
		t.Error("TaintRules nil: the engine would list them itself")
	}
	if r, _ := Read(ctx, c, Options{NoTaintRules: true}); r.TaintRules != nil {
		t.Error("NoTaintRules: TaintRules listed")
	}
	var buf bytes.Buffer
	if err := Write(&buf, read); err != nil {
		t.Fatal(err)
	}
	loaded, err := Load(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(Objects(loaded)), len(Objects(read)); got != want {
		t.Fatalf("loaded %d objects, saved %d", got, want)
	}
	for i, o := range Objects(loaded) {
		if w := Objects(read)[i]; o.GetName() != w.GetName() || o.GetManagedFields() != nil {
			t.Errorf("object %d: loaded %s, saved %s", i, o.GetName(), w.GetName())
		}
	}
	_, err = Load(strings.NewReader("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"))
	if err == nil || !strings.Contains(err.Error(), "ConfigMap") {
		t.Errorf("a ConfigMap in a snapshot: %v, want an error naming the kind", err)
	}
}

func names(pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}
