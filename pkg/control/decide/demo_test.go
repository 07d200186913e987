package decide_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	. "github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/test/testutil"
)

// TestDemoQueues replays demo/queues step by step on a simulated node like
// the demo's (two mock T4s) and checks what its comments narrate: which
// pods run, which wait and why, what is evicted. The demo on a real
// cluster (hack/demo, test/e2e) applies the same files.
func TestDemoQueues(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(testutil.Root(t), "demo", "queues", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("demo/queues: %v", err)
	}
	sort.Strings(files)
	w := newWorld(t, cfg())
	w.node("node-1", NodeOptions{Profile: "t4:2"})
	settle := func() {
		for range 3 {
			w.cycle()
			w.schedule()
		}
	}
	expect := map[string]string{}
	for _, f := range files {
		step := filepath.Base(f)
		for _, obj := range decodeAll(t, f) {
			if addDemoObject(w, obj) {
				continue
			}
			switch o := obj.(type) {
			case *corev1.Pod:
				expect[o.Name] = o.Annotations["demo.tessera.dev/expect"]
				if existing := findPod(w, o.Name); existing != nil {
					existing.Annotations = o.Annotations
					continue
				}
				o.Namespace = "ns"
				o.UID = types.UID("uid-" + o.Name)
				o.CreationTimestamp = w.tick()
				if _, ok := o.Labels[v1alpha1.QueueLabel]; ok {
					o.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: v1alpha1.AdmissionGate}}
				}
				w.snap.Pods = append(w.snap.Pods, o)
			}
		}
		settle()
		switch step {
		case "30-gang.yaml":
			expectVerdict(t, w, "train-0", decide.ReasonDoesNotFit,
				"queue team-b: needs 20Gi gpu memory; quota 4Gi, in use 4Gi, no limit; over quota and no idle capacity fits it (gang train: 3 of 4 members' claims fit)")
		case "40-gang-starts.yaml":
			// a-1's sleep ends.
			w.finish("a-1")
			settle()
		case "50-reclaim.yaml":
			if got := w.evictedNames(); len(got) != 0 {
				t.Fatalf("%s: evicted %v in the last cycle; the gang should have gone earlier", step, got)
			}
			for _, n := range names("train-%d", 4) {
				if findPod(w, n) != nil && findPod(w, n).DeletionTimestamp == nil {
					t.Fatalf("%s: %s not evicted", step, n)
				}
			}
			// The evicted pods end.
			w.remove(names("train-%d", 4)...)
			settle()
		case "60-limit.yaml":
			expectVerdict(t, w, "a-3", decide.ReasonQueueLimit, "queue team-a: needs 8Gi gpu memory; quota 12Gi, in use 8Gi, limit 12Gi")
		}
		for name, want := range expect {
			p := findPod(w, name)
			if p == nil {
				continue // evicted
			}
			var got string
			switch {
			case p.Status.Phase == corev1.PodSucceeded:
				got = "Succeeded"
			case p.Spec.NodeName != "":
				got = "Running"
			default:
				got = "Pending"
			}
			if got != want {
				t.Errorf("after %s: pod %s is %s, want %s (%s)", step, name, got, want, waiting(w))
			}
		}
	}
	if p := findPod(w, "b-1"); p == nil || p.DeletionTimestamp != nil {
		t.Error("b-1 was reclaimed: team-b would have gone below its quota")
	}
}

// addDemoObject adds a demo file's Queue or claim template to the world
// (templates in namespace "ns", defaulted as the API server does); false
// for other objects.
func addDemoObject(w *world, obj any) bool {
	switch o := obj.(type) {
	case *v1alpha1.Queue:
		w.queue(o)
	case *resourceapi.ResourceClaimTemplate:
		o.Namespace = "ns"
		for i := range o.Spec.Spec.Devices.Requests {
			if ex := o.Spec.Spec.Devices.Requests[i].Exactly; ex != nil && ex.AllocationMode == "" {
				ex.AllocationMode, ex.Count = resourceapi.DeviceAllocationModeExactCount, 1
			}
		}
		w.template(o)
	default:
		return false
	}
	return true
}

func findPod(w *world, name string) *corev1.Pod {
	for _, p := range w.snap.Pods {
		if p.Name == name {
			return p
		}
	}
	return nil
}

func decodeAll(t *testing.T, path string) []any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []any
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		var meta struct{ Kind string }
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		var obj any
		switch meta.Kind {
		case "Queue":
			obj = &v1alpha1.Queue{}
		case "ResourceClaimTemplate":
			obj = &resourceapi.ResourceClaimTemplate{}
		case "Pod":
			obj = &corev1.Pod{}
		case "Job":
			obj = &batchv1.Job{}
		case "":
			continue
		default:
			t.Fatalf("%s: unexpected kind %s", path, meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, obj)
	}
}
