package localcluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Kueue (sigs.k8s.io/kueue) is the peer the scale benchmark compares
// Tessera's admission with. Its manager runs as a host process against the
// local cluster, like the kwok controller: built from the module proxy,
// its CRDs from the same module version, its webhooks served on 127.0.0.1
// with a certificate the harness makes and registered with `url:` client
// configurations.
const (
	// KueueWebhookPort, KueueHealthPort and KueueMetricsPort are where the
	// Kueue manager listens (127.0.0.1 only).
	KueueWebhookPort = 18090
	KueueHealthPort  = 18091
	KueueMetricsPort = 18092
	// KueueSystemNamespace is the manager's own namespace (its
	// Configuration's namespace).
	KueueSystemNamespace = "kueue-system"

	compKueue = "kueue"
	// kueueCRDsFile and kueueWebhooksFile are copied from the module
	// (config/components/crd/bases and config/components/webhook) next to
	// the binary.
	kueueCRDsFile     = "crds.yaml"
	kueueWebhooksFile = "webhooks.yaml"
	// kueueMetricsCertDir is where Kueue v0.17 reads its metrics serving
	// certificate when it does not manage certificates itself (a path
	// fixed in cmd/kueue).
	kueueMetricsCertDir = kueueEtcDir + "/metrics/certs"
	kueueEtcDir         = "/etc/kueue"
	// kueuePodWebhookPath is the path of the pod webhooks (mutating and
	// validating share the suffix).
	kueuePodWebhookPath = "-v1-pod"
)

// KueueOptions configure the Kueue manager.
type KueueOptions struct {
	// NamespaceLabel is the label key and value (key=value) that marks the
	// namespaces whose pods Kueue manages; the pod webhooks are only called
	// for pods in them.
	NamespaceLabel string
	// DeviceClassMappings maps a logical resource name (what a
	// ClusterQueue's quota names) to the DeviceClasses it counts
	// (resources.deviceClassMappings, with the DynamicResourceAllocation
	// feature gate).
	DeviceClassMappings map[string][]string
}

// Kueue is a running Kueue manager.
type Kueue struct {
	c *Cluster
	// ownMetricsCerts: the harness made kueueEtcDir and removes it.
	ownMetricsCerts bool
	mutating        string
	validating      string
}

func buildKueue(ctx context.Context, logf Logf, dst string) error {
	return buildOnce(ctx, logf, "kueue", KueueVersion, dst, []string{"kueue"}, "about 3 minutes cold on an idle machine, much longer on a busy one",
		func(work, out string, run runFunc) error {
			// Kueue's go.mod has no replace directives: go install builds it
			// as released.
			if err := run("env", "GOBIN="+out, "CGO_ENABLED=0", "go", "install", "-trimpath", "-ldflags", "-s -w", "sigs.k8s.io/kueue/cmd/kueue@"+KueueVersion); err != nil {
				return err
			}
			mod, err := downloadModule(ctx, work, "sigs.k8s.io/kueue@"+KueueVersion)
			if err != nil {
				return err
			}
			crds, err := concatYAML(filepath.Join(mod.Dir, "config/components/crd/bases"))
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(out, kueueCRDsFile), crds, 0o644); err != nil {
				return err
			}
			hooks, err := os.ReadFile(filepath.Join(mod.Dir, "config/components/webhook/manifests.yaml"))
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(out, kueueWebhooksFile), hooks, 0o644)
		})
}

// concatYAML joins every .yaml file of dir, in name order, into one
// multi-document file.
func concatYAML(dir string) ([]byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var docs []string
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		docs = append(docs, strings.TrimSpace(strings.TrimPrefix(string(b), "---")))
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("no .yaml files in %s", dir)
	}
	return []byte(strings.Join(docs, "\n---\n") + "\n"), nil
}

// kueueBinDir is where the Kueue binary and its manifests are cached.
func kueueBinDir() string { return binDir("kueue", KueueVersion) }

// KueueConfig is the manager's Configuration (config.kueue.x-k8s.io/v1beta2):
// the shipped defaults (client QPS 50, burst 100; 5 concurrent Pod and
// Workload reconciles) with only the pod integration, every listener on
// 127.0.0.1, no leader election, certificates from the harness (certDir),
// the namespaces of opts.NamespaceLabel managed and DRA quota accounting
// for opts.DeviceClassMappings.
func KueueConfig(opts KueueOptions, certDir string) ([]byte, error) {
	key, value, ok := strings.Cut(opts.NamespaceLabel, "=")
	if !ok || key == "" || value == "" {
		return nil, fmt.Errorf("kueue: NamespaceLabel %q must be key=value", opts.NamespaceLabel)
	}
	if len(opts.DeviceClassMappings) == 0 {
		return nil, errors.New("kueue: DeviceClassMappings is empty; map at least one DeviceClass to a resource name")
	}
	var mappings []map[string]any
	for _, name := range sortedMapKeys(opts.DeviceClassMappings) {
		classes := opts.DeviceClassMappings[name]
		if len(classes) == 0 {
			return nil, fmt.Errorf("kueue: DeviceClassMappings[%q] names no DeviceClass", name)
		}
		mappings = append(mappings, map[string]any{"name": name, "deviceClassNames": classes})
	}
	cfg := map[string]any{
		"apiVersion":             "config.kueue.x-k8s.io/v1beta2",
		"kind":                   "Configuration",
		"namespace":              KueueSystemNamespace,
		"health":                 map[string]any{"healthProbeBindAddress": fmt.Sprintf("127.0.0.1:%d", KueueHealthPort)},
		"metrics":                map[string]any{"bindAddress": fmt.Sprintf("127.0.0.1:%d", KueueMetricsPort)},
		"webhook":                map[string]any{"host": "127.0.0.1", "port": KueueWebhookPort, "certDir": certDir},
		"leaderElection":         map[string]any{"leaderElect": false},
		"internalCertManagement": map[string]any{"enable": false},
		"controller": map[string]any{"groupKindConcurrency": map[string]any{
			"Pod": 5, "Workload.kueue.x-k8s.io": 5, "LocalQueue.kueue.x-k8s.io": 1,
			"ClusterQueue.kueue.x-k8s.io": 1, "ResourceFlavor.kueue.x-k8s.io": 1,
		}},
		"clientConnection":             map[string]any{"qps": 50, "burst": 100},
		"manageJobsWithoutQueueName":   false,
		"managedJobsNamespaceSelector": map[string]any{"matchLabels": map[string]string{key: value}},
		"integrations":                 map[string]any{"frameworks": []string{"pod"}},
		"resources":                    map[string]any{"deviceClassMappings": mappings},
		// The visibility server would listen on every interface.
		"featureGates": map[string]bool{"DynamicResourceAllocation": true, "VisibilityOnDemand": false},
	}
	return yaml.Marshal(cfg)
}

func sortedMapKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// KueueWebhooks turns the webhook configurations of Kueue's manifests into
// the ones the harness registers: only the webhooks of Kueue's own kinds
// and of pods (the only integration enabled; the others' paths are not
// served and would refuse every Job or Deployment of the cluster), each
// calling url https://127.0.0.1:port<path> with caBundle, and the pod
// webhooks only for pods in namespaces labelled namespaceLabel (key=value).
func KueueWebhooks(manifests []byte, port int, caBundle []byte, namespaceLabel string) (*admissionv1.MutatingWebhookConfiguration, *admissionv1.ValidatingWebhookConfiguration, error) {
	key, value, ok := strings.Cut(namespaceLabel, "=")
	if !ok || key == "" || value == "" {
		return nil, nil, fmt.Errorf("kueue: namespace label %q must be key=value", namespaceLabel)
	}
	keep := func(path *string) bool {
		return path != nil && (strings.Contains(*path, "-kueue-x-k8s-io-") || strings.HasSuffix(*path, kueuePodWebhookPath))
	}
	selector := &metav1.LabelSelector{MatchLabels: map[string]string{key: value}}
	// rewrite points a webhook Kueue serves at 127.0.0.1 with the harness's
	// CA, and restricts the pod webhooks to the labelled namespaces; keep is
	// false for a webhook Kueue does not serve here.
	rewrite := func(cc *admissionv1.WebhookClientConfig, namespaces **metav1.LabelSelector) (bool, error) {
		if cc.Service == nil {
			return false, errors.New("kueue webhook manifest: a webhook without a service client configuration")
		}
		path := cc.Service.Path
		if !keep(path) {
			return false, nil
		}
		url := fmt.Sprintf("https://127.0.0.1:%d%s", port, *path)
		*cc = admissionv1.WebhookClientConfig{URL: &url, CABundle: caBundle}
		if strings.HasSuffix(*path, kueuePodWebhookPath) {
			*namespaces = selector
		}
		return true, nil
	}
	var (
		mut *admissionv1.MutatingWebhookConfiguration
		val *admissionv1.ValidatingWebhookConfiguration
	)
	dec := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifests)))
	for {
		doc, err := dec.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, err
		}
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return nil, nil, err
		}
		switch meta.Kind {
		case "MutatingWebhookConfiguration":
			mut = &admissionv1.MutatingWebhookConfiguration{}
			if err := yaml.UnmarshalStrict(doc, mut); err != nil {
				return nil, nil, fmt.Errorf("kueue webhook manifest: %w", err)
			}
			var hooks []admissionv1.MutatingWebhook
			for _, h := range mut.Webhooks {
				if keep, err := rewrite(&h.ClientConfig, &h.NamespaceSelector); err != nil {
					return nil, nil, err
				} else if keep {
					hooks = append(hooks, h)
				}
			}
			mut.Name, mut.Webhooks = "kueue-mutating-webhook-configuration", hooks
		case "ValidatingWebhookConfiguration":
			val = &admissionv1.ValidatingWebhookConfiguration{}
			if err := yaml.UnmarshalStrict(doc, val); err != nil {
				return nil, nil, fmt.Errorf("kueue webhook manifest: %w", err)
			}
			var hooks []admissionv1.ValidatingWebhook
			for _, h := range val.Webhooks {
				if keep, err := rewrite(&h.ClientConfig, &h.NamespaceSelector); err != nil {
					return nil, nil, err
				} else if keep {
					hooks = append(hooks, h)
				}
			}
			val.Name, val.Webhooks = "kueue-validating-webhook-configuration", hooks
		case "":
			continue
		default:
			return nil, nil, fmt.Errorf("kueue webhook manifest: unexpected kind %q", meta.Kind)
		}
	}
	if mut == nil || val == nil {
		return nil, nil, errors.New("kueue webhook manifest: needs a MutatingWebhookConfiguration and a ValidatingWebhookConfiguration")
	}
	has := func(paths []string) bool {
		return slices.ContainsFunc(paths, func(p string) bool { return strings.HasSuffix(p, kueuePodWebhookPath) })
	}
	var mp, vp []string
	for _, h := range mut.Webhooks {
		mp = append(mp, *h.ClientConfig.URL)
	}
	for _, h := range val.Webhooks {
		vp = append(vp, *h.ClientConfig.URL)
	}
	if !has(mp) || !has(vp) {
		return nil, nil, errors.New("kueue webhook manifest: no pod webhook (path ending " + kueuePodWebhookPath + ")")
	}
	return mut, val, nil
}

// StartKueue builds Kueue if needed, installs its CRDs, starts its manager
// with KueueConfig and registers its webhooks (KueueWebhooks), and waits
// until it is ready. Kueue.Stop removes the webhooks and stops it; Down
// stops it too.
func (c *Cluster) StartKueue(ctx context.Context, opts KueueOptions) (*Kueue, error) {
	dir := kueueBinDir()
	if err := buildKueue(ctx, c.logf, dir); err != nil {
		return nil, fmt.Errorf("building kueue %s: %w", KueueVersion, err)
	}
	k := &Kueue{c: c}
	root := filepath.Join(c.Dirs.Root, "kueue")
	certDir := filepath.Join(root, "certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, err
	}
	caPEM, err := writeServingCert(certDir)
	if err != nil {
		return nil, err
	}
	if k.ownMetricsCerts, err = placeMetricsCert(certDir); err != nil {
		if k.ownMetricsCerts {
			err = errors.Join(err, os.RemoveAll(kueueEtcDir))
		}
		return nil, err
	}
	conf, err := KueueConfig(opts, certDir)
	if err != nil {
		return nil, err
	}
	confPath := filepath.Join(root, "config.yaml")
	if err := os.WriteFile(confPath, conf, 0o644); err != nil {
		return nil, err
	}
	if _, err := c.Kubectl(ctx, "apply", "--server-side", "-f", filepath.Join(dir, kueueCRDsFile)); err != nil {
		return nil, err
	}
	if _, err := c.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s", "crd", "clusterqueues.kueue.x-k8s.io", "localqueues.kueue.x-k8s.io", "resourceflavors.kueue.x-k8s.io", "workloads.kueue.x-k8s.io"); err != nil {
		return nil, err
	}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: KueueSystemNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	if err := c.start(compKueue, filepath.Join(dir, "kueue"), []string{
		"--config=" + confPath,
		"--kubeconfig=" + c.Kubeconfig,
		"--zap-log-level=2",
	}, []string{c.hostPath()}); err != nil {
		return nil, err
	}
	if err := c.waitFor(ctx, "kueue manager /readyz", 2*time.Minute, []string{compKueue, compAPIServer}, func() (bool, error) {
		_, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz", KueueHealthPort), nil)
		return err == nil, nil
	}); err != nil {
		return k, errors.Join(err, k.Stop(ctx))
	}
	manifests, err := os.ReadFile(filepath.Join(dir, kueueWebhooksFile))
	if err != nil {
		return k, errors.Join(err, k.Stop(ctx))
	}
	mut, val, err := KueueWebhooks(manifests, KueueWebhookPort, caPEM, opts.NamespaceLabel)
	if err != nil {
		return k, errors.Join(err, k.Stop(ctx))
	}
	adm := c.Client.AdmissionregistrationV1()
	if _, err := adm.MutatingWebhookConfigurations().Create(ctx, mut, metav1.CreateOptions{}); err != nil {
		return k, errors.Join(err, k.Stop(ctx))
	}
	k.mutating = mut.Name
	if _, err := adm.ValidatingWebhookConfigurations().Create(ctx, val, metav1.CreateOptions{}); err != nil {
		return k, errors.Join(err, k.Stop(ctx))
	}
	k.validating = val.Name
	return k, nil
}

// Stop removes Kueue's webhook configurations (nothing calls it any more),
// then stops its manager by PID. Its CRDs and objects stay: without the
// manager and the webhooks they act on nothing.
func (k *Kueue) Stop(ctx context.Context) error {
	var errs []error
	adm := k.c.Client.AdmissionregistrationV1()
	if k.mutating != "" {
		if err := adm.MutatingWebhookConfigurations().Delete(ctx, k.mutating, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	if k.validating != "" {
		if err := adm.ValidatingWebhookConfigurations().Delete(ctx, k.validating, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, k.c.stop(compKueue, 10*time.Second))
	if k.ownMetricsCerts {
		errs = append(errs, os.RemoveAll(kueueEtcDir))
		k.ownMetricsCerts = false
	}
	return errors.Join(errs...)
}

// writeServingCert writes a fresh CA and a serving certificate for
// 127.0.0.1 signed by it (tls.crt, tls.key in dir) and returns the CA's
// PEM, the webhooks' caBundle.
func writeServingCert(dir string) ([]byte, error) {
	ca, err := sign(nil, &x509.Certificate{
		Subject:               pkix.Name{CommonName: "tessera-localcluster-kueue-ca"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	})
	if err != nil {
		return nil, err
	}
	serving, err := sign(&ca, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kueue-webhook"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return nil, err
	}
	if _, _, err := writeKeyPair(dir, "tls", serving); err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}), nil
}

// placeMetricsCert copies the serving certificate of certDir to
// kueueMetricsCertDir, where Kueue v0.17 insists on reading one, creating
// kueueEtcDir; it says whether it made it (to be removed with Stop). When
// kueueEtcDir is there already (another Kueue on this host), it uses the
// certificate found there and leaves it.
func placeMetricsCert(certDir string) (bool, error) {
	if _, err := os.Stat(kueueEtcDir); err == nil {
		for _, f := range []string{"tls.crt", "tls.key"} {
			if _, err := os.Stat(filepath.Join(kueueMetricsCertDir, f)); err != nil {
				return false, fmt.Errorf("kueue: %s exists but has no metrics certificate (%v); remove it or put tls.crt and tls.key in %s", kueueEtcDir, err, kueueMetricsCertDir)
			}
		}
		return false, nil
	}
	if err := os.MkdirAll(kueueMetricsCertDir, 0o700); err != nil {
		return false, fmt.Errorf("kueue's metrics certificate directory: %w", err)
	}
	for _, f := range []string{"tls.crt", "tls.key"} {
		b, err := os.ReadFile(filepath.Join(certDir, f))
		if err != nil {
			return true, err
		}
		if err := os.WriteFile(filepath.Join(kueueMetricsCertDir, f), b, 0o600); err != nil {
			return true, err
		}
	}
	return true, nil
}
