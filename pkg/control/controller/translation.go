package controller

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/pkg/control/webhook"
)

// ReasonTranslated is the reason of the event a translated pod gets.
const ReasonTranslated = "Translated"

// TemplateJanitor keeps the ResourceClaimTemplates the translating webhook
// makes (label webhook.ManagedTemplateLabel): it deletes those that no pod
// of their namespace names and none used for Grace (annotation
// webhook.LastUsedAnnotation, refreshed by the webhook on every reuse), and
// gives each translated pod it sees an event saying what was translated
// (the webhook cannot: the pod has no name or UID yet). Leader only.
type TemplateJanitor struct {
	// Client lists templates and pods from the API server (pods are not
	// all in the controller's cache, which holds queued pods only).
	Client   client.Client
	Recorder events.EventRecorder
	Every    time.Duration
	Grace    time.Duration
	Now      func() time.Time

	reported map[types.UID]bool
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (j *TemplateJanitor) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable.
func (j *TemplateJanitor) Start(ctx context.Context) error {
	every := j.Every
	if every <= 0 {
		every = 15 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := j.Pass(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Keeping the translation's templates failed; retrying")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (j *TemplateJanitor) now() time.Time {
	if j.Now != nil {
		return j.Now()
	}
	return time.Now()
}

// Pass runs once: events for new translated pods, deletion of unused
// templates.
func (j *TemplateJanitor) Pass(ctx context.Context) error {
	var list resourceapi.ResourceClaimTemplateList
	if err := j.Client.List(ctx, &list, client.HasLabels{webhook.ManagedTemplateLabel}); err != nil {
		return err
	}
	byNS := map[string][]*resourceapi.ResourceClaimTemplate{}
	for i := range list.Items {
		t := &list.Items[i]
		if t.Labels[webhook.ManagedTemplateLabel] == webhook.ManagedTemplateValue {
			byNS[t.Namespace] = append(byNS[t.Namespace], t)
		}
	}
	if j.reported == nil {
		j.reported = map[types.UID]bool{}
	}
	seen := map[types.UID]bool{}
	for ns, templates := range byNS {
		var pods corev1.PodList
		if err := j.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
			return err
		}
		used := map[string]bool{}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue
			}
			for _, rc := range p.Spec.ResourceClaims {
				if rc.ResourceClaimTemplateName != nil {
					used[*rc.ResourceClaimTemplateName] = true
				}
			}
			if msg, ok := p.Annotations[webhook.TranslatedAnnotation]; ok {
				seen[p.UID] = true
				// A pod translated a while ago was reported before this
				// controller started (or by another leader).
				if !j.reported[p.UID] && j.now().Sub(p.CreationTimestamp.Time) < 2*j.Grace {
					j.Recorder.Eventf(p, nil, corev1.EventTypeNormal, ReasonTranslated, "Translate", "%s", msg)
				}
				j.reported[p.UID] = true
			}
		}
		for _, t := range templates {
			if used[t.Name] || t.DeletionTimestamp != nil {
				continue
			}
			last := t.CreationTimestamp.Time
			if ts, err := time.Parse(time.RFC3339, t.Annotations[webhook.LastUsedAnnotation]); err == nil && ts.After(last) {
				last = ts
			}
			if j.now().Sub(last) < j.Grace {
				continue
			}
			// Only if unchanged since it was read: a pod translated now
			// marks it used (a new resourceVersion).
			err := j.Client.Delete(ctx, t, client.Preconditions{UID: &t.UID, ResourceVersion: &t.ResourceVersion})
			switch {
			case err == nil:
				klog.FromContext(ctx).V(2).Info("Deleted an unused translation template", "template", klog.KObj(t))
			case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			default:
				return err
			}
		}
	}
	for uid := range j.reported {
		if !seen[uid] {
			delete(j.reported, uid)
		}
	}
	return nil
}
