package webhook

import (
	"context"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// ConfigurationName names the webhook configurations the controller keeps.
const ConfigurationName = "tessera-controller"

// Target says how the API server reaches the webhook server: by URL
// (BaseURL, e.g. https://127.0.0.1:9443) or by Service, in configurations
// the controller writes; or through configurations an installer made
// (Mutating, Validating), of which only the caBundle is set.
type Target struct {
	BaseURL    string
	Service    *admissionregistrationv1.ServiceReference
	Mutating   string
	Validating string
	// CABundle verifies the serving certificate.
	CABundle []byte
}

func (t Target) clientConfig(path string) admissionregistrationv1.WebhookClientConfig {
	cc := admissionregistrationv1.WebhookClientConfig{CABundle: t.CABundle}
	if t.Service != nil {
		svc := *t.Service
		svc.Path = ptr.To(path)
		cc.Service = &svc
	} else {
		cc.URL = ptr.To(t.BaseURL + path)
	}
	return cc
}

// EnsureConfigurations creates or updates the mutating (pods) and
// validating (queues) webhook configurations to point at the target.
func EnsureConfigurations(ctx context.Context, c client.Client, t Target) error {
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	mutating := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: ConfigurationName}}
	if _, err := controllerutil.CreateOrUpdate(ctx, c, mutating, func() error {
		mutating.Labels = map[string]string{"app.kubernetes.io/name": "tessera-controller"}
		podRules := []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"},
				Scope: ptr.To(admissionregistrationv1.NamespacedScope),
			},
		}}
		mutating.Webhooks = []admissionregistrationv1.MutatingWebhook{{
			// Pods in a managed namespace (labelled with a queue) that get
			// devices through DRA (a claim or an extended resource a
			// DeviceClass serves) and name no queue: they go through the
			// namespace's.
			Name:         "namespace.gate.pods.tessera.dev",
			ClientConfig: t.clientConfig(PodsPath),
			Rules:        podRules,
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: v1alpha1.QueueLabel, Operator: metav1.LabelSelectorOpExists,
			}}},
			ObjectSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: v1alpha1.QueueLabel, Operator: metav1.LabelSelectorOpDoesNotExist,
			}}},
			MatchConditions:         []admissionregistrationv1.MatchCondition{{Name: "uses-devices", Expression: UsesDevicesExpression}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
		}, {
			Name:         "gate.pods.tessera.dev",
			ClientConfig: t.clientConfig(PodsPath),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"},
					Scope: ptr.To(admissionregistrationv1.NamespacedScope),
				},
			}},
			// Only pods that name a queue reach the webhook.
			ObjectSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: v1alpha1.QueueLabel, Operator: metav1.LabelSelectorOpExists,
			}}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
		}}
		return nil
	}); err != nil {
		return fmt.Errorf("mutating webhook configuration %s: %w", ConfigurationName, err)
	}
	validating := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: ConfigurationName}}
	if _, err := controllerutil.CreateOrUpdate(ctx, c, validating, func() error {
		validating.Labels = map[string]string{"app.kubernetes.io/name": "tessera-controller"}
		validating.Webhooks = []admissionregistrationv1.ValidatingWebhook{{
			Name:         "claims.pods.tessera.dev",
			ClientConfig: t.clientConfig(ClaimsPath),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"},
					Scope: ptr.To(admissionregistrationv1.NamespacedScope),
				},
			}},
			MatchConditions:         []admissionregistrationv1.MatchCondition{{Name: "container-uses-several-devices", Expression: SeveralDevicesExpression}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
		}, {
			Name:         "validate.queues.tessera.dev",
			ClientConfig: t.clientConfig(QueuesPath),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{v1alpha1.GroupVersion.Group}, APIVersions: []string{v1alpha1.GroupVersion.Version}, Resources: []string{"queues"},
					Scope: ptr.To(admissionregistrationv1.ClusterScope),
				},
			}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
		}}
		return nil
	}); err != nil {
		return fmt.Errorf("validating webhook configuration %s: %w", ConfigurationName, err)
	}
	return nil
}

// PatchCABundle sets the caBundle of every webhook in the named
// configurations (made by an installer, e.g. the Helm chart) and changes
// nothing else. An empty name is skipped.
func PatchCABundle(ctx context.Context, c client.Client, mutating, validating string, ca []byte) error {
	if mutating != "" {
		var m admissionregistrationv1.MutatingWebhookConfiguration
		if err := c.Get(ctx, client.ObjectKey{Name: mutating}, &m); err != nil {
			return fmt.Errorf("mutating webhook configuration %s: %w", mutating, err)
		}
		changed := false
		for i := range m.Webhooks {
			if string(m.Webhooks[i].ClientConfig.CABundle) != string(ca) {
				m.Webhooks[i].ClientConfig.CABundle, changed = ca, true
			}
		}
		if changed {
			if err := c.Update(ctx, &m); err != nil {
				return fmt.Errorf("mutating webhook configuration %s: %w", mutating, err)
			}
		}
	}
	if validating != "" {
		var v admissionregistrationv1.ValidatingWebhookConfiguration
		if err := c.Get(ctx, client.ObjectKey{Name: validating}, &v); err != nil {
			return fmt.Errorf("validating webhook configuration %s: %w", validating, err)
		}
		changed := false
		for i := range v.Webhooks {
			if string(v.Webhooks[i].ClientConfig.CABundle) != string(ca) {
				v.Webhooks[i].ClientConfig.CABundle, changed = ca, true
			}
		}
		if changed {
			if err := c.Update(ctx, &v); err != nil {
				return fmt.Errorf("validating webhook configuration %s: %w", validating, err)
			}
		}
	}
	return nil
}
