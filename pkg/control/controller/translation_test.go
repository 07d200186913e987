package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/tessera-dev/tessera/pkg/control/webhook"
)

// The janitor deletes managed templates that no live pod names and that
// were not used for the grace period, keeps every other template, and
// gives each live translated pod one event.
func TestTemplateJanitor(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	old, recent := now.Add(-time.Hour), now.Add(-time.Minute)
	tmpl := func(ns, name string, created time.Time, lastUsed *time.Time, managed bool) *resourceapi.ResourceClaimTemplate {
		t := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(created), UID: types.UID("u-" + ns + name)}}
		if managed {
			t.Labels = map[string]string{webhook.ManagedTemplateLabel: webhook.ManagedTemplateValue}
		} else {
			t.Labels = map[string]string{webhook.ManagedTemplateLabel: "someone-else"}
		}
		if lastUsed != nil {
			t.Annotations = map[string]string{webhook.LastUsedAnnotation: lastUsed.Format(time.RFC3339)}
		}
		return t
	}
	pod := func(ns, name, template string, phase corev1.PodPhase, translated bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + ns + name), CreationTimestamp: metav1.NewTime(recent)},
			Spec:   corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(template)}}},
			Status: corev1.PodStatus{Phase: phase}}
		if translated {
			p.Annotations = map[string]string{webhook.TranslatedAnnotation: "container main: nvidia.com/gpu: 1 -> 1 whole GPU of gpu.tessera.dev"}
		}
		return p
	}
	objs := []client.Object{
		tmpl("a", "tessera-translated-used", old, nil, true),
		tmpl("a", "tessera-translated-finished", old, nil, true),     // only a Succeeded pod names it
		tmpl("a", "tessera-translated-unused-old", old, nil, true),   // deleted
		tmpl("a", "tessera-translated-reused", old, &recent, true),   // the webhook marked it a minute ago
		tmpl("b", "tessera-translated-just-made", recent, nil, true), // within grace
		tmpl("b", "not-ours", old, nil, false),
		pod("a", "running", "tessera-translated-used", corev1.PodRunning, true),
		pod("a", "done", "tessera-translated-finished", corev1.PodSucceeded, true),
	}
	c := fake.NewClientBuilder().WithScheme(mustScheme(t)).WithObjects(objs...).Build()
	rec := events.NewFakeRecorder(10)
	j := &TemplateJanitor{Client: c, Recorder: rec, Grace: 10 * time.Minute, Now: func() time.Time { return now }}
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if err := j.Pass(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var list resourceapi.ResourceClaimTemplateList
	if err := c.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, tm := range list.Items {
		left = append(left, tm.Name)
	}
	if got, want := strings.Join(left, ","), "tessera-translated-reused,tessera-translated-used,not-ours,tessera-translated-just-made"; got != want {
		t.Errorf("templates left %s, want %s", got, want)
	}
	close(rec.Events)
	var evs []string
	for e := range rec.Events {
		evs = append(evs, e)
	}
	// The running pod once over two passes; the finished one none.
	if len(evs) != 1 || !strings.Contains(evs[0], ReasonTranslated) || !strings.Contains(evs[0], "1 whole GPU") {
		t.Errorf("events %q, want one %s event for the running translated pod", evs, ReasonTranslated)
	}
}

func mustScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s, err := NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	return s
}
