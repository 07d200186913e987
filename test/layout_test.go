// Package test holds the layout rules of the repository's tests and tools.
package test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestTestImportsNoHack: hack/ (commands: the demo, benchmarks, the image
// build, the local cluster) may import test/ (the local-cluster harness,
// scenarios, the scale harness), never the reverse, so the two never
// import each other and the tools can move into a module of their own.
func TestTestImportsNoHack(t *testing.T) {
	const module = "github.com/tessera-dev/tessera/"
	out, err := exec.Command("go", "list", "-tags", "e2e", "-test", "-f", `{{.ImportPath}}:{{join .Imports " "}}`, "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, ":")
		pkg, _, _ = strings.Cut(pkg, " ") // "p [p.test]"
		if !strings.HasPrefix(pkg, module+"test/") && pkg != module+"test" {
			continue
		}
		for _, imp := range strings.Fields(imports) {
			if strings.HasPrefix(imp, module+"hack/") {
				t.Errorf("%s imports %s: test/ must not import hack/ (move what both need into test/)", strings.TrimPrefix(pkg, module), strings.TrimPrefix(imp, module))
			}
		}
	}
}

// TestCommandsLinkNoTooling: the shipped commands (./cmd/...) link no
// package of test/ or hack/ and none of the modules only the tooling uses
// (benchmark plots, the image build, the scale report's profiles). Those
// stay in go.mod because test/ packages of this module need them (see
// docs/architecture.md), but a binary users run must not carry them.
func TestCommandsLinkNoTooling(t *testing.T) {
	const module = "github.com/tessera-dev/tessera/"
	toolingOnly := []string{
		"gonum.org/v1/plot",                      // benchmark plots (pkg/sim.PlotBars, hack/bench)
		"github.com/google/go-containerregistry", // the image build (test/imagebuild)
		"github.com/google/pprof",                // the scale report's profiles (test/scale)
	}
	for _, cmd := range []string{"./cmd/kubelet-plugin", "./cmd/controller", "./cmd/kubectl-tessera"} {
		out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}`, "../"+cmd).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", cmd, err, out)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			pkg, mod, _ := strings.Cut(line, " ")
			if strings.HasPrefix(pkg, module+"test/") || strings.HasPrefix(pkg, module+"hack/") {
				t.Errorf("%s links %s: commands must not link test/ or hack/", cmd, strings.TrimPrefix(pkg, module))
			}
			for _, m := range toolingOnly {
				if mod == m {
					t.Errorf("%s links %s (module %s), which only the tooling should use: move what the command needs away from the package that imports it", cmd, pkg, m)
				}
			}
		}
	}
}
