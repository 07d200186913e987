package helm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	tesserav1alpha1 "github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/test/testutil"
)

// helmBinary returns the pinned helm, building it on first use. The test is
// skipped only when helm cannot be built.
func helmBinary(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		helmPath, helmErr = Binary(ctx, func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) })
	})
	if helmErr != nil {
		t.Skipf("SKIP: helm %s could not be built from the Go module proxy, so the chart is not checked: %v", Version, helmErr)
	}
	return helmPath
}

func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Dir = testutil.Root(t)
	// No kubeconfig, no repositories, no cache outside a temp dir: the
	// render must not depend on the machine.
	tmp := t.TempDir()
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+filepath.Join(tmp, "no-kubeconfig"),
		"HELM_CACHE_HOME="+filepath.Join(tmp, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(tmp, "config"),
		"HELM_DATA_HOME="+filepath.Join(tmp, "data"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// valueSet is one configuration the chart is rendered with.
type valueSet struct {
	name  string
	files []string // relative to the repository root
	set   []string // --set-string / --set arguments, already paired
}

func (v valueSet) args() []string {
	var a []string
	for _, f := range v.files {
		a = append(a, "--values", f)
	}
	return append(a, v.set...)
}

// render runs helm template for a value set.
func render(t *testing.T, vs valueSet) string {
	t.Helper()
	args := append([]string{"template", ReleaseName, ChartPath, "--namespace", DefaultNamespace, "--kube-version", kubeVersion}, vs.args()...)
	out, err := runHelm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// manifest is one rendered object.
type manifest struct {
	source string // "# Source:" line
	raw    []byte
	meta   struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ObjectMeta `json:"metadata"`
	}
}

func (m *manifest) key() string { return m.meta.Kind + "/" + m.meta.Metadata.Name }

func parse(t *testing.T, out string) []*manifest {
	t.Helper()
	var ms []*manifest
	for _, doc := range strings.Split(out, "\n---\n") {
		doc = strings.TrimPrefix(strings.TrimSpace(doc), "---")
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		m := &manifest{raw: []byte(doc)}
		if i := strings.Index(doc, "# Source: "); i >= 0 {
			m.source = strings.SplitN(doc[i+len("# Source: "):], "\n", 2)[0]
		}
		if err := yaml.Unmarshal(m.raw, &m.meta); err != nil {
			t.Fatalf("%s: not YAML: %v\n%s", m.source, err, doc)
		}
		ms = append(ms, m)
	}
	return ms
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// typed decodes every object strictly into its Go type: a misplaced or
// misspelt field in a template fails here, before any cluster sees it.
func typed(t *testing.T, ms []*manifest) map[string]any {
	t.Helper()
	objs := map[string]any{}
	for _, m := range ms {
		var obj any
		switch m.meta.APIVersion + "/" + m.meta.Kind {
		case "apps/v1/DaemonSet":
			obj = &appsv1.DaemonSet{}
		case "apps/v1/Deployment":
			obj = &appsv1.Deployment{}
		case "v1/ServiceAccount":
			obj = &corev1.ServiceAccount{}
		case "v1/Service":
			obj = &corev1.Service{}
		case "v1/Secret":
			obj = &corev1.Secret{}
		case "v1/ConfigMap":
			obj = &corev1.ConfigMap{}
		case "rbac.authorization.k8s.io/v1/ClusterRole":
			obj = &rbacv1.ClusterRole{}
		case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
			obj = &rbacv1.ClusterRoleBinding{}
		case "rbac.authorization.k8s.io/v1/Role":
			obj = &rbacv1.Role{}
		case "rbac.authorization.k8s.io/v1/RoleBinding":
			obj = &rbacv1.RoleBinding{}
		case "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy":
			obj = &admissionregistrationv1.ValidatingAdmissionPolicy{}
		case "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding":
			obj = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		case "admissionregistration.k8s.io/v1/MutatingWebhookConfiguration":
			obj = &admissionregistrationv1.MutatingWebhookConfiguration{}
		case "admissionregistration.k8s.io/v1/ValidatingWebhookConfiguration":
			obj = &admissionregistrationv1.ValidatingWebhookConfiguration{}
		case "policy/v1/PodDisruptionBudget":
			obj = &policyv1.PodDisruptionBudget{}
		case "resource.k8s.io/v1/DeviceClass":
			obj = &resourceapi.DeviceClass{}
		case "tessera.dev/v1alpha1/Queue":
			obj = &tesserav1alpha1.Queue{}
		case "v1/Pod":
			obj = &corev1.Pod{}
		case "cert-manager.io/v1/Issuer", "cert-manager.io/v1/Certificate", "monitoring.coreos.com/v1/ServiceMonitor":
			obj = map[string]any{} // no Go types here; checked by shape below
		default:
			t.Errorf("%s: unexpected object %s %s; add it to typed()", m.source, m.meta.APIVersion, m.meta.Kind)
			continue
		}
		if err := yaml.UnmarshalStrict(m.raw, &obj); err != nil {
			t.Errorf("%s: %s does not decode strictly: %v", m.source, m.key(), err)
			continue
		}
		if _, dup := objs[m.key()]; dup {
			t.Errorf("%s: %s rendered twice", m.source, m.key())
		}
		objs[m.key()] = obj
	}
	return objs
}

func get[T any](t *testing.T, objs map[string]any, kind, name string) T {
	t.Helper()
	o, ok := objs[kind+"/"+name]
	if !ok {
		var keys []string
		for k := range objs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		t.Fatalf("%s/%s not rendered; have %v", kind, name, keys)
	}
	return o.(T)
}

func byKind[T any](objs map[string]any) []T {
	var out []T
	keys := make([]string, 0, len(objs))
	for k := range objs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if o, ok := objs[k].(T); ok {
			out = append(out, o)
		}
	}
	return out
}

func renderTyped(t *testing.T, vs valueSet) map[string]any {
	t.Helper()
	return typed(t, parse(t, render(t, vs)))
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

func hasArg(c corev1.Container, arg string) bool {
	for _, a := range c.Args {
		if a == arg {
			return true
		}
	}
	return false
}

func argValue(c corev1.Container, flagName string) (string, bool) {
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, flagName+"="); ok {
			return v, true
		}
	}
	return "", false
}

func envVar(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func hostPaths(spec corev1.PodSpec) map[string]string {
	out := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			out[v.Name] = v.HostPath.Path
		}
	}
	return out
}

func mountPath(c corev1.Container, volume string) string {
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return m.MountPath
		}
	}
	return ""
}
