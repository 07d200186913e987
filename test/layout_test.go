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
