package helm

import (
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/webhook"
	"github.com/tessera-dev/tessera/test/testutil"
)

// translationValues turns translation on (in labelled namespaces).
var translationValues = []string{"--set", "translation.enabled=true",
	"--set-json", `translation.queueNames={"default-queue":"team-a"}`, "--set-json", `translation.schedulerNames=["kai-scheduler"]`}

// The chart renders translation only when asked, lists its webhook first
// (webhooks of one configuration run in order: the gating ones see the
// translated pod), in the right namespaces, with the controller's flags;
// deviceClasses.extendedResourceName can name nvidia.com/gpu on the
// whole-GPU or the time-slice class.
func TestTranslationValues(t *testing.T) {
	off := render(t, valueSets[0])
	for _, w := range []string{"translate.pods.admission.tessera.dev", "--translate", "translation-templates", "tessera.dev/translated"} {
		if strings.Contains(off, w) {
			t.Errorf("translation is off by default, yet the render has %q", w)
		}
	}
	for _, tc := range []struct {
		name     string
		set      []string
		wantNS   metav1.LabelSelectorRequirement
		wantArgs []string
	}{
		{"labelled namespaces", translationValues,
			metav1.LabelSelectorRequirement{Key: "tessera.dev/translate", Operator: "In", Values: []string{"enabled"}},
			[]string{"--translate=true", "--translate-device-plugin=whole", "--translate-queue-names=default-queue=team-a", "--translate-scheduler-names=kai-scheduler", "--translate-gpu-memory-mib=0", "--translate-template-grace=10m"}},
		{"cluster-wide, time-sliced", append(append([]string(nil), translationValues...), "--set", "translation.clusterWide=true", "--set", "translation.devicePlugin=timeslice", "--set", "translation.gpuMemoryMiB=15104"),
			metav1.LabelSelectorRequirement{Key: "kubernetes.io/metadata.name", Operator: "NotIn", Values: []string{DefaultNamespace, "kube-system"}},
			[]string{"--translate-device-plugin=timeslice", "--translate-gpu-memory-mib=15104"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := renderTyped(t, valueSet{name: tc.name, set: tc.set})
			m := get[*admissionregistrationv1.MutatingWebhookConfiguration](t, objs, "MutatingWebhookConfiguration", ReleaseName+"-pod-admission")
			first := m.Webhooks[0]
			if first.Name != "translate.pods.admission.tessera.dev" || len(m.Webhooks) != 3 {
				t.Fatalf("webhooks %d, first %s: want the translating webhook first of 3", len(m.Webhooks), first.Name)
			}
			if *first.FailurePolicy != admissionregistrationv1.Fail || *first.SideEffects != admissionregistrationv1.SideEffectClassNoneOnDryRun ||
				first.ClientConfig.Service == nil || *first.ClientConfig.Service.Path != webhook.TranslatePath {
				t.Errorf("translating webhook: failurePolicy %v, sideEffects %v, clientConfig %+v", *first.FailurePolicy, *first.SideEffects, first.ClientConfig)
			}
			if got := first.NamespaceSelector.MatchExpressions; len(got) != 1 || fmt.Sprint(got[0]) != fmt.Sprint(tc.wantNS) {
				t.Errorf("namespaceSelector %v, want %v", got, tc.wantNS)
			}
			squash := func(s string) string { return strings.Join(strings.Fields(s), "") }
			if len(first.MatchConditions) != 1 || squash(first.MatchConditions[0].Expression) != squash(webhook.TranslateExpression) {
				t.Errorf("match conditions %+v, want pkg/control/webhook's TranslateExpression", first.MatchConditions)
			}
			out := render(t, valueSet{set: tc.set})
			for _, a := range tc.wantArgs {
				if !strings.Contains(out, "- "+a+"\n") {
					t.Errorf("controller args lack %s", a)
				}
			}
			if !strings.Contains(out, "name: "+ReleaseName+"-translation-templates") {
				t.Error("no translation-templates policy")
			}
		})
	}
	if out, err := runHelm(t, append([]string{"template", ReleaseName, ChartPath, "--kube-version", kubeVersion, "--set", "webhook.enabled=false"}, translationValues...)...); err == nil || !strings.Contains(out+err.Error(), "translation.enabled=true needs") {
		t.Errorf("translation without the webhook: %v %s", err, out)
	}
	for _, class := range []string{"gpu", "timeslice"} {
		objs := renderTyped(t, valueSet{set: []string{"--set", "deviceClasses.extendedResourceName.enabled=true",
			"--set-string", "deviceClasses.extendedResourceName.name=nvidia.com/gpu", "--set-string", "deviceClasses.extendedResourceName.class=" + class}})
		for _, dc := range []string{"gpu.tessera.dev", "timeslice.tessera.dev", "mig.tessera.dev"} {
			got := get[*resourceapi.DeviceClass](t, objs, "DeviceClass", dc).Spec.ExtendedResourceName
			want := dc == class+".tessera.dev"
			if (got != nil && *got == "nvidia.com/gpu") != want || (got != nil && !want) {
				t.Errorf("class %s: DeviceClass %s extendedResourceName %v", class, dc, got)
			}
		}
	}
}

// TestTranslationInAPIServer runs the translating and gating webhooks
// against a real kube-apiserver with the chart's configuration and
// policies: device-plugin, HAMi and KAI pods of a tenant with `edit` come
// out queued, gated and with claims on managed templates; the tenant
// cannot make, change or delete a managed template, nor forge the
// translation's annotation; refusals name the field.
func TestTranslationInAPIServer(t *testing.T) {
	s, ctx, _ := chartAPIServer(t)
	port := testutil.FreePort(t)
	s.installChart(t, append([]string{
		"--set", fmt.Sprintf("webhook.port=%d", port),
		"--set-string", fmt.Sprintf("webhook.url=https://127.0.0.1:%d", port)}, translationValues...)...)
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(s.config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	// The webhook writes templates as the controller's service account.
	ctlCfg := rest.CopyConfig(s.config)
	ctlCfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + DefaultNamespace + ":" + controllerName,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + DefaultNamespace, "system:authenticated"}}
	ctl, err := client.New(ctlCfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	serveWebhooks(t, ctx, c, port, func(srv ctrlwebhook.Server, dec admission.Decoder) {
		cfg := webhook.TranslateConfig{Driver: "gpu.tessera.dev", GPUClass: "gpu.tessera.dev", TimeSliceClass: "timeslice.tessera.dev",
			DevicePlugin: webhook.DevicePluginWhole, QueueNames: map[string]string{"default-queue": "team-a"}, SchedulerNames: []string{"kai-scheduler"}, GPUMemoryMiB: 15104}
		srv.Register(webhook.TranslatePath, &ctrlwebhook.Admission{Handler: &webhook.PodTranslator{Decoder: dec, Reader: c, Client: ctl, Config: cfg}})
	})
	for deadline := time.Now().Add(30 * time.Second); ; {
		err := c.Create(ctx, &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Spec: v1alpha1.QueueSpec{Parent: "nope"}}, client.DryRunAll)
		if err != nil && strings.Contains(err.Error(), "does not exist") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the webhook server does not answer: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
	}

	// A tenant with what `edit` gives on pods and claim templates, in a
	// translating namespace and in another.
	editLike := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "tenant-edit"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "delete", "patch", "update", "get", "list"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims", "resourceclaimtemplates"}, Verbs: []string{"create", "delete", "patch", "update", "get", "list"}},
	}}
	if err := c.Create(ctx, editLike); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "migrating", Labels: map[string]string{webhook.TranslateNamespaceLabel: "enabled"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "plain"}},
	} {
		if err := c.Create(ctx, ns); err != nil {
			t.Fatal(err)
		}
		for _, o := range []client.Object{
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "default"}},
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "tenant"}},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "tenant-edit"},
				Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "tenant", Namespace: ns.Name}},
				RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "tenant-edit"}},
		} {
			if err := c.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	tenant := s.impersonate(t, "migrating", "tenant", "")
	tenantPlain := s.impersonate(t, "plain", "tenant", "")
	// The API server loads new policies within a few seconds.
	probe := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "plain", Name: webhook.ManagedTemplatePrefix + "probe"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev"}}}}}}}
	for deadline := time.Now().Add(60 * time.Second); ; {
		_, err := tenantPlain.ResourceV1().ResourceClaimTemplates("plain").Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), "translation only") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the translation-templates policy is not enforced 60s after install: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}

	pod := func(ns, name string, limits map[string]string, ann, labels map[string]string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann, Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}}}
		if len(limits) > 0 {
			l := corev1.ResourceList{}
			for k, v := range limits {
				l[corev1.ResourceName(k)] = resource.MustParse(v)
			}
			p.Spec.Containers[0].Resources.Limits = l
		}
		return p
	}
	create := func(p *corev1.Pod) (*corev1.Pod, error) {
		cl := tenant
		if p.Namespace == "plain" {
			cl = tenantPlain
		}
		return cl.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	}
	kai := map[string]string{webhook.LabelKAIQueue: "default-queue"}
	for _, tc := range []struct {
		name  string
		pod   *corev1.Pod
		class string
		mem   string // "" none
		cores string
		queue string
	}{
		{"device plugin", pod("migrating", "dp", map[string]string{"nvidia.com/gpu": "1"}, nil, map[string]string{v1alpha1.QueueLabel: "team-a"}), "gpu.tessera.dev", "", "", "team-a"},
		{"HAMi", pod("migrating", "hami", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}, nil, nil), "gpu.tessera.dev", "3000Mi", "30", ""},
		{"KAI", func() *corev1.Pod {
			p := pod("migrating", "kai", nil, map[string]string{"gpu-fraction": "0.5"}, kai)
			p.Spec.SchedulerName = "kai-scheduler"
			return p
		}(), "gpu.tessera.dev", "7552Mi", "", "team-a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := create(tc.pod)
			if err != nil {
				t.Fatalf("created: %v", err)
			}
			if p.Annotations[webhook.TranslatedAnnotation] == "" || len(p.Spec.ResourceClaims) != 1 || len(p.Spec.Containers[0].Resources.Claims) != 1 {
				t.Fatalf("not translated: annotations %v, claims %v", p.Annotations, p.Spec.ResourceClaims)
			}
			for k := range p.Spec.Containers[0].Resources.Limits {
				if strings.HasPrefix(string(k), "nvidia.com/") {
					t.Errorf("limit %s left", k)
				}
			}
			if tc.queue != "" && (p.Labels[v1alpha1.QueueLabel] != tc.queue || len(p.Spec.SchedulingGates) != 1) {
				t.Errorf("queue %q, gates %v: want queue %s and the admission gate", p.Labels[v1alpha1.QueueLabel], p.Spec.SchedulingGates, tc.queue)
			}
			if p.Spec.SchedulerName != "default-scheduler" {
				t.Errorf("schedulerName %q", p.Spec.SchedulerName)
			}
			var tmpl resourceapi.ResourceClaimTemplate
			if err := c.Get(ctx, client.ObjectKey{Namespace: "migrating", Name: *p.Spec.ResourceClaims[0].ResourceClaimTemplateName}, &tmpl); err != nil {
				t.Fatal(err)
			}
			r := tmpl.Spec.Spec.Devices.Requests[0].Exactly
			mem, cores := "", ""
			if r.Capacity != nil {
				if q, ok := r.Capacity.Requests["memory"]; ok {
					mem = q.String()
				}
				if q, ok := r.Capacity.Requests["cores"]; ok {
					cores = q.String()
				}
			}
			if r.DeviceClassName != tc.class || mem != tc.mem || cores != tc.cores || tmpl.Labels[webhook.ManagedTemplateLabel] != webhook.ManagedTemplateValue {
				t.Errorf("template %s: class %s memory %q cores %q labels %v; want %s %q %q", tmpl.Name, r.DeviceClassName, mem, cores, tmpl.Labels, tc.class, tc.mem, tc.cores)
			}
		})
	}

	refused := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want refused with %q", what, err, want)
		}
	}
	_, err = create(pod("migrating", "bad", nil, map[string]string{"gpu-fraction": "1.5"}, kai))
	refused("fraction out of range", err, "metadata.annotations[gpu-fraction]")
	_, err = create(pod("migrating", "two", map[string]string{"nvidia.com/gpumem": "1000"}, map[string]string{"gpu-fraction": "0.5"}, nil))
	refused("two systems", err, "two systems' keys")

	// The annotation: overwritten in a translating namespace, refused
	// elsewhere (the policy; no webhook runs there).
	if p, err := create(pod("migrating", "forged", nil, map[string]string{webhook.TranslatedAnnotation: "80 GPUs"}, nil)); err != nil || p.Annotations[webhook.TranslatedAnnotation] != "" {
		t.Errorf("forged annotation in a translating namespace: %v, annotations %v; want it removed", err, p.Annotations)
	}
	_, err = create(pod("plain", "forged", nil, map[string]string{webhook.TranslatedAnnotation: "80 GPUs"}, nil))
	refused("forged annotation elsewhere", err, "tessera.dev/translated")

	// Managed templates are the controller's.
	var list resourceapi.ResourceClaimTemplateList
	if err := c.List(ctx, &list, client.InNamespace("migrating")); err != nil || len(list.Items) == 0 {
		t.Fatalf("templates: %v %v", list.Items, err)
	}
	managed := list.Items[0].DeepCopy()
	// A template's spec is immutable; its labels and annotations are not.
	upd := managed.DeepCopy()
	upd.Labels = nil
	_, err = tenant.ResourceV1().ResourceClaimTemplates("migrating").Update(ctx, upd, metav1.UpdateOptions{})
	refused("tenant unlabels a managed template", err, "made and deleted by Tessera's translation only")
	refused("tenant deletes a managed template", tenant.ResourceV1().ResourceClaimTemplates("migrating").Delete(ctx, managed.Name, metav1.DeleteOptions{}), "made and deleted by Tessera's translation only")
	planted := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "plain", Name: managed.Name}, Spec: managed.Spec}
	planted.Spec.Spec.Devices.Requests[0].Exactly.Count = 8
	_, err = tenantPlain.ResourceV1().ResourceClaimTemplates("plain").Create(ctx, planted, metav1.CreateOptions{})
	refused("tenant plants a template under a managed name", err, "made and deleted by Tessera's translation only")
	labelled := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "plain", Name: "mine", Labels: map[string]string{webhook.ManagedTemplateLabel: webhook.ManagedTemplateValue}}, Spec: managed.Spec}
	_, err = tenantPlain.ResourceV1().ResourceClaimTemplates("plain").Create(ctx, labelled, metav1.CreateOptions{})
	refused("tenant labels a template managed", err, "made and deleted by Tessera's translation only")
	own := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "plain", Name: "mine"}, Spec: managed.Spec}
	if _, err := tenantPlain.ResourceV1().ResourceClaimTemplates("plain").Create(ctx, own, metav1.CreateOptions{}); err != nil {
		t.Errorf("tenant's own template: %v", err)
	}
	if err := ctl.Delete(ctx, managed); err != nil {
		t.Errorf("the controller deletes a managed template: %v", err)
	}
}
