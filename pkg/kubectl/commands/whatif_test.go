package commands

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/shadow"
	"github.com/tessera-dev/tessera/pkg/control/snapshot"
)

// what-if --from a saved snapshot: a higher limit starts the gated pod the
// queue's limit holds; removing the node makes both wait.
func TestWhatIfFromSnapshot(t *testing.T) {
	slices, err := decidetest.NodeSlices("n1", decidetest.NodeOptions{Profile: "h100-80gb:1"})
	if err != nil {
		t.Fatal(err)
	}
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	st := &decide.Snapshot{
		Queues:    []*v1alpha1.Queue{decidetest.Queue("team-a", "", "50Gi", "50Gi")},
		Templates: []*resourceapi.ResourceClaimTemplate{decidetest.Template("ns", "gpu30", decidetest.Request{Memory: "30Gi"})},
		Pods: []*corev1.Pod{
			decidetest.Pod("ns", "a", decidetest.PodOptions{Queue: "team-a", Templates: []string{"gpu30"}, Gated: true, Created: t0}),
			decidetest.Pod("ns", "b", decidetest.PodOptions{Queue: "team-a", Templates: []string{"gpu30"}, Gated: true, Created: metav1.NewTime(t0.Add(time.Second))}),
		},
		Slices: slices, Classes: decidetest.Classes(), Nodes: []*corev1.Node{decidetest.Node("n1")},
	}
	dir := t.TempDir()
	var buf bytes.Buffer
	if err := snapshot.Write(&buf, st); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state.yaml")
	queues := filepath.Join(dir, "queues.yaml")
	if err := os.WriteFile(state, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	q := "apiVersion: tessera.dev/v1alpha1\nkind: Queue\nmetadata: {name: team-a}\nspec:\n  resources:\n    gpu.tessera.dev/memory: {quota: 70Gi, limit: 70Gi}\n"
	if err := os.WriteFile(queues, []byte(q), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"what-if", "--from", state, "-f", queues}, []string{"team-a", "1/1/0", "2/0/0", "ns/b", "waits (QueueLimit) -> starts"}},
		{[]string{"what-if", "--from", state, "--remove-node", "n1"}, []string{"ns/a", "starts -> waits"}},
		{[]string{"what-if", "--help"}, []string{"--add-nodes", "--controller-flags"}},
		{[]string{"shadow", "--help"}, []string{"would-admit"}},
		{[]string{"snapshot", "--help"}, []string{"kubectl tessera snapshot > state.yaml"}},
	} {
		t.Run(strings.Join(tc.args[:1], " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			cmd := NewRootCommand(Streams{Out: &out, Err: &errOut})
			cmd.SetArgs(tc.args)
			if err := cmd.Execute(); err != nil {
				t.Fatalf("%v: %v", tc.args, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("%v: output lacks %q:\n%s", tc.args, w, out.String())
				}
			}
		})
	}
}

func TestShadowReportLookup(t *testing.T) {
	ctx := t.Context()
	var rep shadow.Report
	rep.Add(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), []shadow.Difference{{Kind: shadow.WouldAdmit, Queue: "team-a", Workload: "ns/b", Shadow: "admit", Active: "holds it: QueueLimit"}})
	data, err := rep.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "tessera", Name: "r", Labels: map[string]string{"app.kubernetes.io/component": "shadow-report"}},
		Data: map[string]string{shadow.ReportKey: data}}
	c := fake.NewClientset(cm)
	got, err := shadowReport(ctx, c, "tessera", "")
	if err != nil {
		t.Fatal(err)
	}
	r, err := shadow.Parse(got)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	r.Print(&out, 0)
	for _, w := range []string{"would-admit", "ns/b", "+ shadow: admit", "- active: holds it: QueueLimit"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, out.String())
		}
	}
	if _, err := shadowReport(ctx, c, "other", ""); err == nil || !strings.Contains(err.Error(), "no shadow report") {
		t.Errorf("no report: %v", err)
	}
}
