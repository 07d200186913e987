package controller_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/controller"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

// TestIdleAPI, against a real kube-apiserver: the CRD's CEL rules refuse
// a bad spec.idle and default the action; an idle pod of an Evict queue
// that a PodDisruptionBudget guards is refused by the Eviction API (429:
// no disruption controller runs here, so the budget allows none), stays,
// and is evicted on a later pass once the budget is gone.
func TestIdleAPI(t *testing.T) {
	e := startEnv(t)
	ctx := e.ctx
	for _, tc := range []struct {
		after, usedBelow string
		want             string // "" accepted, else part of the error
	}{
		{"2h", "5%", ""},
		{"1m", "0.5%", ""},
		{"1m", "100%", ""},
		{"30s", "5%", "after must be at least 1m"},
		{"9000h", "5%", "at most 8760h"},
		{"1m", "101%", "usedBelow must be a percentage"},
		{"1m", "5", "usedBelow must be a percentage"},
		{"1m", "-1%", "usedBelow must be a percentage"},
	} {
		q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "cel"}, Spec: v1alpha1.QueueSpec{Idle: &v1alpha1.IdlePolicy{UsedBelow: tc.usedBelow}}}
		d, err := time.ParseDuration(tc.after)
		if err != nil {
			t.Fatal(err)
		}
		q.Spec.Idle.After.Duration = d
		err = e.c.Create(ctx, q, client.DryRunAll)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("after %s usedBelow %s refused: %v", tc.after, tc.usedBelow, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("after %s usedBelow %s: %v; want an error with %q", tc.after, tc.usedBelow, err, tc.want)
		case tc.want == "" && q.Spec.Idle.Action != v1alpha1.IdleReport:
			t.Errorf("action defaulted to %q; want Report", q.Spec.Idle.Action)
		}
	}

	q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "idle"}, Spec: v1alpha1.QueueSpec{
		Idle: &v1alpha1.IdlePolicy{After: metav1.Duration{Duration: time.Minute}, UsedBelow: "5%", Action: v1alpha1.IdleEvict}}}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "idle-gpu"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: devicemodel.DriverName}}}}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "idle", Labels: map[string]string{v1alpha1.QueueLabel: "idle", "app": "idle"},
		Annotations: map[string]string{v1alpha1.AdmittedAtAnnotation: time.Now().UTC().Format(time.RFC3339)}},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("idle-gpu")}}}}
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "keep"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "idle"}}}}
	e.create(q, claim, pod, pdb)
	pod.Status.Phase = corev1.PodRunning
	if err := e.c.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(v1alpha1.DeviceStatus{UUID: "GPU-1", MemoryLimitBytes: 4 << 30, ComputeLimit: 100,
		Usage: &v1alpha1.DeviceUsage{SampledAt: metav1.NewTime(time.Now().Add(-2 * time.Minute))}})
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: devicemodel.DriverName, Pool: "node-1", Device: "gpu-0"}}}}
	claim.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: devicemodel.DriverName, Pool: "node-1", Device: "gpu-0", Data: &runtime.RawExtension{Raw: raw}}}
	if err := e.c.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}

	r := controller.NewIdleReclaimer(e.c, e.c, events.NewFakeRecorder(100), nil)
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	got := e.pod("idle")
	if got.DeletionTimestamp != nil {
		t.Fatal("evicted despite the PodDisruptionBudget")
	}
	if c := idleCond(got); c == nil || c.Status != corev1.ConditionTrue || c.Reason != controller.ReasonIdleEvictWaits {
		t.Fatalf("condition %+v; want True %s", c, controller.ReasonIdleEvictWaits)
	}
	if err := e.c.Delete(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	var after corev1.Pod
	err := e.c.Get(ctx, client.ObjectKeyFromObject(pod), &after)
	if err == nil && after.DeletionTimestamp == nil {
		t.Fatalf("not evicted once the budget is gone: %+v", idleCond(&after))
	}
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

func idleCond(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == v1alpha1.IdleCondition {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}
