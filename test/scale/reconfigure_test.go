package scale

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// TestConfigureController: the controller's Deployment goes to zero
// replicas, then comes back with the flags set, though its own controller
// writes it in between (a conflict on each update); it returns once the
// new controller leads.
func TestConfigureController(t *testing.T) {
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "# TYPE leader_election_master_status gauge")
		fmt.Fprintln(w, `leader_election_master_status{name="tessera-controller"} 1`)
	}))
	defer metrics.Close()
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: controllerDeployment, Namespace: controllerNamespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "c"}},
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "controller", Args: []string{"--pin-nodes=all", "-v=2"}}}}},
		},
	}
	cs := fake.NewClientset(dep)
	var replicas []int32
	conflicts := 0
	cs.PrependReactor("update", "deployments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		d := a.(k8stesting.UpdateAction).GetObject().(*appsv1.Deployment)
		if conflicts < 2 && len(replicas) == conflicts {
			conflicts++
			return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "apps", Resource: "deployments"}, d.Name, fmt.Errorf("modified"))
		}
		replicas = append(replicas, *d.Spec.Replicas)
		return false, nil, nil
	})
	h := &harness{cs: cs, logf: t.Logf, endpoints: []endpoint{{name: "controller", url: metrics.URL, client: metrics.Client()}}}
	if err := h.configureController(t.Context(), map[string]string{"--pin-nodes": "none"}); err != nil {
		t.Fatal(err)
	}
	got, err := cs.AppsV1().Deployments(controllerNamespace).Get(t.Context(), controllerDeployment, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if args := got.Spec.Template.Spec.Containers[0].Args; !slices.Equal(args, []string{"--pin-nodes=none", "-v=2"}) {
		t.Errorf("args = %q", args)
	}
	if !slices.Equal(replicas, []int32{0, 1}) || *got.Spec.Replicas != 1 {
		t.Errorf("replicas went %v (now %d), want 0 then 1", replicas, *got.Spec.Replicas)
	}
	// Back to the chart's own: one more round; the same flags again: none.
	if err := h.configureController(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if err := h.configureController(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	got, _ = cs.AppsV1().Deployments(controllerNamespace).Get(t.Context(), controllerDeployment, metav1.GetOptions{})
	if args := got.Spec.Template.Spec.Containers[0].Args; !slices.Equal(args, []string{"--pin-nodes=all", "-v=2"}) {
		t.Errorf("args after going back = %q", args)
	}
	if !slices.Equal(replicas, []int32{0, 1, 0, 1}) {
		t.Errorf("replicas went %v, want 0, 1, 0, 1 (and nothing for a change to the same flags)", replicas)
	}
}
