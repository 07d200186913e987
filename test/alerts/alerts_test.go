// Package alerts tests the chart's PrometheusRule with Prometheus' own
// rule unit tests: the chart is rendered with alerts.enabled=true, its
// rule groups written to a file, and `promtool test rules` runs
// testdata/rules_test.yaml against them (input series, expected alerts).
//
// promtool is built from the Go module proxy into the repository's cache
// (${TESSERA_CACHE_DIR:-~/.cache/tessera}/bin/promtool-<version>/promtool)
// by `make promtool-bin` (make test runs it before the tests), or by the
// test the first time, like helm; $PROMTOOL names another binary. Building it
// as a tool keeps Prometheus out of the product's go.mod.
package alerts

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/pkg/control/controller"
	"github.com/tessera-dev/tessera/pkg/node/plugin"
	"github.com/tessera-dev/tessera/test/helm"
	"github.com/tessera-dev/tessera/test/testutil"
)

// PromtoolVersion is the Prometheus module version promtool is built from
// (v0.316.0 is Prometheus v3.16.0).
const PromtoolVersion = "v0.316.0"

func promtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PROMTOOL"); p != "" {
		return p
	}
	dst := filepath.Join(helm.CacheDir(), "bin", "promtool-"+PromtoolVersion, "promtool")
	if fi, err := os.Stat(dst); err == nil && fi.Mode()&0o111 != 0 {
		return dst
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dst), ".build-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	t.Logf("building promtool %s from the Go module proxy into %s (once; several minutes on a cold cache)", PromtoolVersion, dst)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	gobin := "go"
	if g := os.Getenv("GO"); g != "" {
		gobin = g
	}
	// As `make promtool-bin` builds it: without Prometheus' service
	// discovery plugins, which `promtool test rules` never uses and which
	// are most of its build (cloud SDKs).
	cmd := exec.CommandContext(ctx, gobin, "install", "-trimpath", "-tags", "remove_all_sd", "-ldflags", "-s -w",
		"github.com/prometheus/prometheus/cmd/promtool@"+PromtoolVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false", "GOWORK=off")
	cmd.Dir = tmp // outside any module: promtool's own go.mod decides
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install promtool@%s: %v\n%s", PromtoolVersion, err, out)
	}
	if err := os.Rename(filepath.Join(tmp, "promtool"), dst); err != nil {
		t.Fatal(err)
	}
	return dst
}

// render returns the chart's PrometheusRule spec (its groups) as YAML.
func render(t *testing.T, set ...string) (string, bool) {
	t.Helper()
	root, err := testutil.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := helm.Binary(context.Background(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"template", helm.ReleaseName, filepath.Join(root, helm.ChartPath)}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("helm %v: %v\n%s", args, err, out)
	}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var obj struct {
			Kind string         `json:"kind"`
			Spec map[string]any `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("decode: %v\n%s", err, doc)
		}
		if obj.Kind == "PrometheusRule" {
			b, err := yaml.Marshal(obj.Spec)
			if err != nil {
				t.Fatal(err)
			}
			return string(b), true
		}
	}
	return "", false
}

func TestRulesOffByDefault(t *testing.T) {
	if _, ok := render(t); ok {
		t.Fatal("a PrometheusRule is rendered with the default values; want none unless alerts.enabled")
	}
}

// TestRulesNameExportedMetrics fails when a rule names a metric that
// neither the kubelet plugin nor the controller exports.
func TestRulesNameExportedMetrics(t *testing.T) {
	rules, ok := render(t, "alerts.enabled=true")
	if !ok {
		t.Fatal("no PrometheusRule with alerts.enabled=true")
	}
	known := append(plugin.MetricNames(), controller.MetricNames()...)
	names := regexp.MustCompile(`tessera_[a-z_]+`).FindAllString(rules, -1)
	if len(names) == 0 {
		t.Fatal("no tessera metric in the rules")
	}
	for _, n := range names {
		base := n
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if strings.HasSuffix(n, suffix) && !slices.Contains(known, n) {
				base = strings.TrimSuffix(n, suffix)
			}
		}
		if !slices.Contains(known, base) {
			t.Errorf("the rules name %s, which no Tessera binary exports", n)
		}
	}
}

// TestRulesPromtool runs `promtool test rules` on testdata/rules_test.yaml.
func TestRulesPromtool(t *testing.T) {
	// Only `go test -short` skips (a quick local run); make test never
	// passes -short, so CI always builds promtool and runs the rules.
	if testing.Short() {
		t.Skip("builds promtool on first use")
	}
	rules, ok := render(t, "alerts.enabled=true")
	if !ok {
		t.Fatal("no PrometheusRule with alerts.enabled=true")
	}
	bin := promtool(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("testdata/rules_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "check", "rules", filepath.Join(dir, "rules.yaml")).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "test", "rules", "rules_test.yaml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// make promtool-bin builds the version this test uses.
func TestPromtoolVersionMatchesMakefile(t *testing.T) {
	mk, err := os.ReadFile(testutil.Path(t, "deployments", "helm", "helm.mk"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^PROMTOOL_VERSION\s*:=\s*` + regexp.QuoteMeta(PromtoolVersion) + `\s*$`).Match(mk) {
		t.Errorf("deployments/helm/helm.mk PROMTOOL_VERSION is not %s", PromtoolVersion)
	}
}
