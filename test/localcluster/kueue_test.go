package localcluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// kueueManifests is the shape of Kueue's config/components/webhook
// manifests: service client configurations, webhooks of Kueue's kinds,
// of pods and of integrations the harness does not enable.
const kueueManifests = `---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-kueue-x-k8s-io-v1beta2-clusterqueue}
  failurePolicy: Fail
  name: mclusterqueue.kb.io
  rules:
  - {apiGroups: [kueue.x-k8s.io], apiVersions: [v1beta2], operations: [CREATE], resources: [clusterqueues]}
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-batch-v1-job}
  failurePolicy: Fail
  name: mjob.kb.io
  rules:
  - {apiGroups: [batch], apiVersions: [v1], operations: [CREATE], resources: [jobs]}
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}
  failurePolicy: Fail
  name: mpod.kb.io
  rules:
  - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}
  sideEffects: None
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /validate--v1-pod}
  failurePolicy: Fail
  name: vpod.kb.io
  rules:
  - {apiGroups: [""], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [pods]}
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /validate-apps-v1-deployment}
  failurePolicy: Fail
  name: vdeployment.kb.io
  rules:
  - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments]}
  sideEffects: None
`

func TestKueueWebhooks(t *testing.T) {
	ca := []byte("CA PEM")
	mut, val, err := KueueWebhooks([]byte(kueueManifests), 18090, ca, "peer=kueue")
	if err != nil {
		t.Fatal(err)
	}
	type hook struct {
		name, url string
		nsLabels  map[string]string
	}
	var hooks []hook
	add := func(name string, cc admissionv1.WebhookClientConfig, sel *metav1.LabelSelector) {
		if cc.Service != nil || cc.URL == nil || string(cc.CABundle) != "CA PEM" {
			t.Fatalf("%s: client configuration %+v, want only a url and the CA", name, cc)
		}
		h := hook{name: name, url: *cc.URL}
		if sel != nil {
			h.nsLabels = sel.MatchLabels
		}
		hooks = append(hooks, h)
	}
	for _, h := range mut.Webhooks {
		add(h.Name, h.ClientConfig, h.NamespaceSelector)
	}
	for _, h := range val.Webhooks {
		add(h.Name, h.ClientConfig, h.NamespaceSelector)
	}
	want := []hook{
		{name: "mclusterqueue.kb.io", url: "https://127.0.0.1:18090/mutate-kueue-x-k8s-io-v1beta2-clusterqueue"},
		{name: "mpod.kb.io", url: "https://127.0.0.1:18090/mutate--v1-pod", nsLabels: map[string]string{"peer": "kueue"}},
		{name: "vpod.kb.io", url: "https://127.0.0.1:18090/validate--v1-pod", nsLabels: map[string]string{"peer": "kueue"}},
	}
	if len(hooks) != len(want) {
		t.Fatalf("webhooks %+v, want %+v (job and deployment dropped)", hooks, want)
	}
	for i := range want {
		g, w := hooks[i], want[i]
		if g.name != w.name || g.url != w.url || len(g.nsLabels) != len(w.nsLabels) || g.nsLabels["peer"] != w.nsLabels["peer"] {
			t.Errorf("webhook %d = %+v, want %+v", i, g, w)
		}
	}
	if mut.Name != "kueue-mutating-webhook-configuration" || val.Name != "kueue-validating-webhook-configuration" {
		t.Errorf("names %q, %q", mut.Name, val.Name)
	}
}

func TestKueueWebhooksErrors(t *testing.T) {
	onlyMutating := kueueManifests[:strings.Index(kueueManifests, "---\napiVersion: admissionregistration.k8s.io/v1\nkind: Validating")]
	noPods := strings.ReplaceAll(kueueManifests, "-v1-pod", "-v1-podx")
	for _, tc := range []struct {
		name, manifests, label, want string
	}{
		{"bad label", kueueManifests, "peer", "must be key=value"},
		{"no validating", onlyMutating, "peer=kueue", "needs a MutatingWebhookConfiguration and a ValidatingWebhookConfiguration"},
		{"no pod webhook", noPods, "peer=kueue", "no pod webhook"},
		{"other kind", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\n", "peer=kueue", `unexpected kind "Service"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := KueueWebhooks([]byte(tc.manifests), 1, nil, tc.label)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestKueueConfig(t *testing.T) {
	b, err := KueueConfig(KueueOptions{NamespaceLabel: "peer=kueue", DeviceClassMappings: map[string][]string{"example.com/gpu": {"gpu.example.com"}}}, "/certs")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		APIVersion, Kind, Namespace string
		Webhook                     struct {
			Host    string
			Port    int
			CertDir string `json:"certDir"`
		}
		Health struct {
			Addr string `json:"healthProbeBindAddress"`
		}
		Metrics struct {
			Addr string `json:"bindAddress"`
		}
		LeaderElection struct {
			LeaderElect bool `json:"leaderElect"`
		} `json:"leaderElection"`
		ManageJobsWithoutQueueName bool `json:"manageJobsWithoutQueueName"`
		Selector                   struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"managedJobsNamespaceSelector"`
		Integrations struct{ Frameworks []string }
		Resources    struct {
			Mappings []struct {
				Name    string
				Classes []string `json:"deviceClassNames"`
			} `json:"deviceClassMappings"`
		}
		FeatureGates map[string]bool `json:"featureGates"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ what, got, want string }{
		{"apiVersion", cfg.APIVersion, "config.kueue.x-k8s.io/v1beta2"},
		{"kind", cfg.Kind, "Configuration"},
		{"namespace", cfg.Namespace, KueueSystemNamespace},
		{"webhook host", cfg.Webhook.Host, "127.0.0.1"},
		{"webhook certDir", cfg.Webhook.CertDir, "/certs"},
		{"health", cfg.Health.Addr, "127.0.0.1:18091"},
		{"metrics", cfg.Metrics.Addr, "127.0.0.1:18092"},
		{"namespace selector", cfg.Selector.MatchLabels["peer"], "kueue"},
		{"frameworks", strings.Join(cfg.Integrations.Frameworks, ","), "pod"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.what, c.got, c.want)
		}
	}
	if cfg.Webhook.Port != KueueWebhookPort || cfg.LeaderElection.LeaderElect || cfg.ManageJobsWithoutQueueName {
		t.Errorf("port %d, leader election %v, manageJobsWithoutQueueName %v", cfg.Webhook.Port, cfg.LeaderElection.LeaderElect, cfg.ManageJobsWithoutQueueName)
	}
	if len(cfg.Resources.Mappings) != 1 || cfg.Resources.Mappings[0].Name != "example.com/gpu" || strings.Join(cfg.Resources.Mappings[0].Classes, ",") != "gpu.example.com" {
		t.Errorf("deviceClassMappings %+v", cfg.Resources.Mappings)
	}
	if !cfg.FeatureGates["DynamicResourceAllocation"] || cfg.FeatureGates["VisibilityOnDemand"] {
		t.Errorf("feature gates %v, want DynamicResourceAllocation on and VisibilityOnDemand off", cfg.FeatureGates)
	}
}

func TestKueueConfigErrors(t *testing.T) {
	m := map[string][]string{"example.com/gpu": {"gpu.example.com"}}
	for _, tc := range []struct {
		name string
		opts KueueOptions
		want string
	}{
		{"no label", KueueOptions{DeviceClassMappings: m}, "NamespaceLabel"},
		{"label without value", KueueOptions{NamespaceLabel: "peer=", DeviceClassMappings: m}, "must be key=value"},
		{"no mappings", KueueOptions{NamespaceLabel: "peer=kueue"}, "DeviceClassMappings is empty"},
		{"mapping without class", KueueOptions{NamespaceLabel: "peer=kueue", DeviceClassMappings: map[string][]string{"example.com/gpu": nil}}, `DeviceClassMappings["example.com/gpu"] names no DeviceClass`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := KueueConfig(tc.opts, "/certs")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestConcatYAML(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"b.yaml": "---\nkind: B\n", "a.yaml": "kind: A\n", "notes.txt": "x"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := concatYAML(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := "kind: A\n---\nkind: B\n"; string(got) != want {
		t.Errorf("concatYAML = %q, want %q", got, want)
	}
	if _, err := concatYAML(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no .yaml files") {
		t.Errorf("empty dir: err = %v", err)
	}
}
