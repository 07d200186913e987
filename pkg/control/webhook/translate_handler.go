package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/tessera-dev/tessera/pkg/control/sliceintern"
)

// TranslatePath is where the PodTranslator is served. The chart lists its
// webhook before the gating ones, so a translated pod is gated as a pod
// written with claims is.
const TranslatePath = "/mutate--v1-pod-translate"

// TranslateExpression is the match condition of the translating webhook:
// a pod with another system's GPU keys or queue label, a scheduler name
// the translation may rewrite, or the translation's own annotation (so a
// forged value is always overwritten). The chart repeats it.
const TranslateExpression = `object.metadata.?annotations.orValue({}).exists(k, k in ["` + TranslatedAnnotation + `", "` +
	AnnKAIFraction + `", "` + AnnKAIMemory + `", "` + AnnKAINumDevices + `", "` + AnnKAIContainer + `", "` + AnnKAIMPS + `", "` +
	AnnHAMiUseType + `", "` + AnnHAMiNoUseType + `", "` + AnnHAMiUseUUID + `", "` + AnnHAMiNoUseUUID + `", "` + AnnHAMiVGPUMode + `"]) || ` +
	`object.metadata.?labels.orValue({}).exists(k, k in ["` + LabelKAIQueue + `", "` + LabelRunAIQueue + `"]) || ` +
	`object.spec.?schedulerName.orValue("") in ["` + KAISchedulerName + `", "` + HAMiSchedulerName + `"] || ` +
	`(object.spec.containers + object.spec.?initContainers.orValue([])).exists(c, c.?resources.?limits.orValue({}).exists(k, k.startsWith("nvidia.com/")) || c.?resources.?requests.orValue({}).exists(k, k.startsWith("nvidia.com/")))`

// PodTranslator translates pods written for the device plugin, HAMi or
// KAI into pods with claims on Tessera's classes (TranslateConfig), and
// makes the managed templates those claims name.
type PodTranslator struct {
	Decoder admission.Decoder
	// Reader lists the ResourceSlices (a cache is fine: the inventory
	// only sizes fractions and checks selectors).
	Reader client.Reader
	// Attributes reads the devices' attributes where Reader is the
	// controller's cache (sliceintern's compact form); nil: the slices
	// carry them.
	Attributes *sliceintern.Interner
	// Client reads and creates the managed templates (the API server).
	Client client.Client
	Config TranslateConfig
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Handle implements admission.Handler.
func (t *PodTranslator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	pod := &corev1.Pod{}
	if err := t.Decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	// Read only: a cache's objects as they are, not a copy of every
	// published device for each pod.
	var slices resourceapi.ResourceSliceList
	if err := t.Reader.List(ctx, &slices, client.UnsafeDisableDeepCopy); err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("listing ResourceSlices: %w", err))
	}
	tr, err := t.Config.Translate(pod, InventoryFromSlices(t.Config.Driver, slices.Items, t.Attributes))
	var terr *TranslateError
	switch {
	case errors.As(err, &terr):
		return admission.Denied(terr.Error())
	case err != nil:
		return admission.Errored(http.StatusInternalServerError, err)
	case tr.Pod == nil:
		return admission.Allowed("nothing to translate").WithWarnings(tr.Warnings...)
	}
	if req.DryRun == nil || !*req.DryRun {
		for _, tmpl := range tr.Templates {
			if err := t.ensureTemplate(ctx, tmpl); err != nil {
				var terr *TranslateError
				if errors.As(err, &terr) {
					return admission.Denied(terr.Error())
				}
				return admission.Errored(http.StatusInternalServerError, err)
			}
		}
	}
	orig, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	mutated, err := json.Marshal(tr.Pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	klog.FromContext(ctx).V(2).Info("Translated pod", "pod", klog.KRef(pod.Namespace, podName(pod, req)), "translated", tr.Summary)
	resp := admission.PatchResponseFromRaw(orig, mutated)
	warnings := tr.Warnings
	if tr.Summary != "" {
		warnings = append(warnings, "translated for Tessera: "+tr.Summary)
	}
	return resp.WithWarnings(warnings...)
}

// ensureTemplate creates a managed template, or checks that the one of
// that name is the translation's own with the same spec (names are
// hashes of the spec; nobody else may create or change one, by policy).
func (t *PodTranslator) ensureTemplate(ctx context.Context, tmpl *resourceapi.ResourceClaimTemplate) error {
	var have resourceapi.ResourceClaimTemplate
	err := t.Client.Get(ctx, client.ObjectKeyFromObject(tmpl), &have)
	if apierrors.IsNotFound(err) {
		create := tmpl.DeepCopy()
		create.Annotations[LastUsedAnnotation] = t.now().UTC().Format(time.RFC3339)
		err = t.Client.Create(ctx, create)
		if apierrors.IsAlreadyExists(err) {
			err = t.Client.Get(ctx, client.ObjectKeyFromObject(tmpl), &have)
		} else if err != nil {
			return fmt.Errorf("creating ResourceClaimTemplate %s/%s: %w", tmpl.Namespace, tmpl.Name, err)
		} else {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("reading ResourceClaimTemplate %s/%s: %w", tmpl.Namespace, tmpl.Name, err)
	}
	if have.Labels[ManagedTemplateLabel] != ManagedTemplateValue || !apiequality.Semantic.DeepEqual(have.Spec, tmpl.Spec) {
		return &TranslateError{Path: "ResourceClaimTemplate " + tmpl.Namespace + "/" + tmpl.Name,
			Msg: "exists and is not the one the translation made (names starting " + ManagedTemplatePrefix + " are Tessera's): ask the platform to delete it"}
	}
	if have.DeletionTimestamp != nil {
		return fmt.Errorf("ResourceClaimTemplate %s/%s is being deleted (no pod used it); create the pod again", tmpl.Namespace, tmpl.Name)
	}
	// Tell the controller's clean-up that it is in use again (it deletes
	// only templates unused for a while and named by no pod).
	if last, err := time.Parse(time.RFC3339, have.Annotations[LastUsedAnnotation]); err != nil || t.now().Sub(last) > time.Minute {
		patch := client.MergeFrom(have.DeepCopy())
		if have.Annotations == nil {
			have.Annotations = map[string]string{}
		}
		have.Annotations[LastUsedAnnotation] = t.now().UTC().Format(time.RFC3339)
		if err := t.Client.Patch(ctx, &have, patch); err != nil {
			return fmt.Errorf("marking ResourceClaimTemplate %s/%s used: %w", tmpl.Namespace, tmpl.Name, err)
		}
	}
	return nil
}

func (t *PodTranslator) now() time.Time {
	if t.Now != nil {
		return t.Now()
	}
	return time.Now()
}
