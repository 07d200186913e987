package queue

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

func TestOwners(t *testing.T) {
	mk := func(name, parent, controller string) *v1alpha1.Queue {
		return &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.QueueSpec{Parent: parent, ControllerName: controller}}
	}
	tests := []struct {
		name   string
		queues []*v1alpha1.Queue
		want   map[string]Owner // Refused: a substring, "" for none
	}{{
		name:   "unnamed tree goes to the main controller",
		queues: []*v1alpha1.Queue{mk("root", "", ""), mk("a", "root", "")},
		want:   map[string]Owner{"root": {Controller: "default", Root: "root"}, "a": {Controller: "default", Root: "root"}},
	}, {
		name:   "children follow their root",
		queues: []*v1alpha1.Queue{mk("root", "", "canary"), mk("mid", "root", ""), mk("a", "mid", ""), mk("b", "mid", "canary")},
		want: map[string]Owner{"root": {Controller: "canary", Root: "root"}, "mid": {Controller: "canary", Root: "root"},
			"a": {Controller: "canary", Root: "root"}, "b": {Controller: "canary", Root: "root"}},
	}, {
		name:   "a child naming another controller is refused and stays with its root's",
		queues: []*v1alpha1.Queue{mk("root", "", ""), mk("a", "root", "canary"), mk("b", "root", "")},
		want: map[string]Owner{"root": {Controller: "default", Root: "root"}, "a": {Controller: "default", Root: "root", Refused: `spec.controllerName "canary" is not followed`},
			"b": {Controller: "default", Root: "root"}},
	}, {
		name:   "a child naming the main controller under a canary root is refused",
		queues: []*v1alpha1.Queue{mk("root", "", "canary"), mk("a", "root", "default")},
		want:   map[string]Owner{"root": {Controller: "canary", Root: "root"}, "a": {Controller: "canary", Root: "root", Refused: "set spec.controllerName on root"}},
	}, {
		name:   "explicit default equals empty",
		queues: []*v1alpha1.Queue{mk("root", "", "default"), mk("a", "root", "")},
		want:   map[string]Owner{"root": {Controller: "default", Root: "root"}, "a": {Controller: "default", Root: "root"}},
	}, {
		name:   "a missing parent makes the queue its own root",
		queues: []*v1alpha1.Queue{mk("orphan", "gone", "canary")},
		want:   map[string]Owner{"orphan": {Controller: "canary", Root: "orphan"}},
	}, {
		name:   "a cycle goes to the main controller",
		queues: []*v1alpha1.Queue{mk("x", "y", "canary"), mk("y", "x", "canary")},
		want:   map[string]Owner{"x": {Controller: "default"}, "y": {Controller: "default"}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Owners(tt.queues)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d owners, want %d: %+v", len(got), len(tt.want), got)
			}
			for name, want := range tt.want {
				g := got[name]
				if g.Controller != want.Controller || g.Root != want.Root {
					t.Errorf("%s: got controller %q root %q, want %q %q", name, g.Controller, g.Root, want.Controller, want.Root)
				}
				if (want.Refused == "") != (g.Refused == "") || !strings.Contains(g.Refused, want.Refused) {
					t.Errorf("%s: refused %q, want it to contain %q", name, g.Refused, want.Refused)
				}
			}
		})
	}
}
