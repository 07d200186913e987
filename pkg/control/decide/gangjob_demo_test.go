package decide_test

import (
	"fmt"
	"path/filepath"
	"sort"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	. "github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/test/testutil"
)

// TestDemoGangJob replays demo/gang-job on a simulated node of two mock
// T4s, creating each indexed Job's pods from its template as the Job
// controller does: the 4 x 8Gi gang waits whole (2 of 4 fit), the 4 x 6Gi
// gang behind it in the same queue starts whole.
func TestDemoGangJob(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(testutil.Root(t), "demo", "gang-job", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("demo/gang-job: %v", err)
	}
	sort.Strings(files)
	w := newWorld(t, cfg())
	w.node("node-1", NodeOptions{Profile: "t4:2"})
	jobs := map[string][]string{}
	for _, f := range files {
		for _, obj := range decodeAll(t, f) {
			if addDemoObject(w, obj) {
				continue
			}
			switch o := obj.(type) {
			case *batchv1.Job:
				for i := range int(*o.Spec.Parallelism) {
					p := &corev1.Pod{ObjectMeta: *o.Spec.Template.ObjectMeta.DeepCopy(), Spec: *o.Spec.Template.Spec.DeepCopy()}
					p.Name = fmt.Sprintf("%s-%d", o.Name, i)
					p.Namespace = "ns"
					p.UID = types.UID("uid-" + p.Name)
					p.CreationTimestamp = w.tick()
					p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: v1alpha1.AdmissionGate}}
					w.snap.Pods = append(w.snap.Pods, p)
					jobs[o.Name] = append(jobs[o.Name], p.Name)
				}
			}
		}
		for range 3 {
			w.cycle()
			w.schedule()
		}
		step := filepath.Base(f)
		switch step {
		case "20-job-too-big.yaml":
			expectVerdict(t, w, "sweep-0", decide.ReasonDoesNotFit, "gang sweep: 2 of 4 members' claims fit")
		case "30-job-fits.yaml":
			expectVerdict(t, w, "sweep-0", decide.ReasonDoesNotFit, "gang sweep: 0 of 4 members' claims fit")
			for _, n := range jobs["train"] {
				if p := findPod(w, n); p == nil || p.Spec.NodeName == "" {
					t.Errorf("after %s: %s does not run (%s)", step, n, waiting(w))
				}
			}
		}
		for _, n := range jobs["sweep"] {
			if p := findPod(w, n); p == nil || p.Spec.NodeName != "" || len(p.Spec.SchedulingGates) == 0 {
				t.Errorf("after %s: %s started; the gang does not fit whole", step, n)
			}
		}
	}
}
