package scenario

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/test/localcluster"
	"github.com/tessera-dev/tessera/test/testutil"
)

// Every scenario's YAML decodes into API objects, its pods use only the
// local image without pulling (the network rule), print what they see and
// consume a claim.
func TestScenarioYAML(t *testing.T) {
	root := testutil.Root(t)
	sch := runtime.NewScheme()
	if err := scheme.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	decoder := serializer.NewCodecFactory(sch).UniversalDeserializer()
	for _, s := range Scenarios {
		files, err := s.Files(root)
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			if !s.Optional {
				t.Errorf("scenario %s: demo/%s has no YAML", s.Name, s.Name)
			}
			continue
		}
		if _, err := os.Stat(filepath.Join(s.Dir(root), "README.md")); err != nil {
			t.Errorf("scenario %s has no README.md", s.Name)
		}
		if s.Optional {
			continue // the controller's scenario: its own conventions
		}
		pods := 0
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, doc := range splitYAML(string(b)) {
				if strings.TrimSpace(stripComments(doc)) == "" {
					continue
				}
				obj, _, err := decoder.Decode([]byte(doc), nil, nil)
				if err != nil {
					t.Errorf("%s: %v", f, err)
					continue
				}
				var p *corev1.Pod
				switch o := obj.(type) {
				case *corev1.Pod:
					p = o
				case *batchv1.Job:
					p = &corev1.Pod{ObjectMeta: o.Spec.Template.ObjectMeta, Spec: o.Spec.Template.Spec}
					p.Name = "job " + o.Name
				default:
					continue
				}
				pods++
				if len(p.Spec.ResourceClaims) == 0 {
					t.Errorf("%s: pod %s has no resource claim", f, p.Name)
				}
				for _, c := range p.Spec.Containers {
					if c.Image != localcluster.BusyboxImage || c.ImagePullPolicy != corev1.PullNever {
						t.Errorf("%s: pod %s container %s uses %s (pull %s); only %s with imagePullPolicy Never may be used", f, p.Name, c.Name, c.Image, c.ImagePullPolicy, localcluster.BusyboxImage)
					}
					if !strings.Contains(strings.Join(c.Command, " "), "env | grep -E 'TESSERA|CUDA|NVIDIA' | sort") {
						t.Errorf("%s: pod %s does not print its environment", f, p.Name)
					}
					if len(c.Resources.Claims) == 0 {
						t.Errorf("%s: pod %s container %s uses no claim", f, p.Name, c.Name)
					}
				}
			}
		}
		if pods == 0 {
			t.Errorf("scenario %s has no pods", s.Name)
		}
	}
}

func stripComments(doc string) string {
	var out []string
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestReadManifests(t *testing.T) {
	f := filepath.Join(t.TempDir(), "x.yaml")
	if err := os.WriteFile(f, []byte("# comment\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  annotations:\n    demo.tessera.dev/expect: Pending\n---\n\n---\nkind: ConfigMap\nmetadata: {name: b}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := ReadManifests(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 2 || m[0].Kind != "Pod" || m[0].Name != "a" || m[0].Annotations[ExpectAnnotation] != "Pending" || m[1].Name != "b" {
		t.Fatalf("got %+v", m)
	}
}

func TestExpectation(t *testing.T) {
	r := NewRun(&Env{}, Scenario{}, "ns")
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Status: corev1.PodStatus{Phase: corev1.PodPending}}
	if r.Expectation(p) != corev1.PodRunning {
		t.Error("default must be Running")
	}
	p.Annotations = map[string]string{ExpectAnnotation: "pending"}
	if r.Expectation(p) != corev1.PodPending {
		t.Error("annotation ignored")
	}
	r.Expect["p"] = corev1.PodRunning
	if r.Expectation(p) != corev1.PodRunning {
		t.Error("override ignored")
	}
	// A pod expected Pending counts once the scheduler has a verdict, and
	// is an error once it runs.
	delete(r.Expect, "p")
	if ok, err := r.met(p); ok || err != nil {
		t.Errorf("no verdict yet: ok=%v err=%v", ok, err)
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/1 nodes"}}
	if ok, err := r.met(p); !ok || err != nil {
		t.Errorf("unschedulable: ok=%v err=%v", ok, err)
	}
	p.Spec.NodeName, p.Status.Phase = "n", corev1.PodRunning
	if _, err := r.met(p); err == nil {
		t.Error("a pod expected Pending that runs must be an error")
	}
}

func TestParseEnvAndFormat(t *testing.T) {
	env := ParseEnv("CUDA_DEVICE_MEMORY_LIMIT_0=2000m\nTESSERA_MODE=interposer\nnot a var\nX=a=b\n")
	if env["CUDA_DEVICE_MEMORY_LIMIT_0"] != "2000m" || env["TESSERA_MODE"] != "interposer" || env["X"] != "a=b" || len(env) != 3 {
		t.Fatalf("got %v", env)
	}
	for q, want := range map[string]string{"2000Mi": "2000Mi", "4Gi": "4Gi", "15104Mi": "15104Mi", "1000": "1000"} {
		v := resource.MustParse(q)
		if got := FormatMemory(&v); got != want {
			t.Errorf("FormatMemory(%s) = %s", q, got)
		}
	}
}

func TestVerify(t *testing.T) {
	mem := resource.MustParse("2000Mi")
	pl := Placement{
		Pod:    &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}},
		Claims: []Claim{{Devices: []Device{{Name: "gpu-0", Memory: &mem, Attributes: map[string]string{"type": "gpu", "uuid": "GPU-1"}}}}},
		Env:    map[string]string{"TESSERA_MEMORY_LIMIT": "2097152000", "CUDA_DEVICE_MEMORY_LIMIT_0": "2000m", "NVIDIA_VISIBLE_DEVICES": "GPU-1"},
	}
	if checked, problems := Verify([]Placement{pl}); len(checked) != 1 || len(problems) != 0 {
		t.Fatalf("checked %v problems %v", checked, problems)
	}
	pl.Env["CUDA_DEVICE_MEMORY_LIMIT_0"] = "2000Mi"
	pl.Env["NVIDIA_VISIBLE_DEVICES"] = "GPU-2"
	if _, problems := Verify([]Placement{pl}); len(problems) != 2 {
		t.Fatalf("want 2 problems, got %v", problems)
	}
}
