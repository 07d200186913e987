package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The data path reads top-down (discover → model → publish → prepare →
// CDI) over nvml.Interface; only pkg/node/nvmlsource decides whether that is the
// node's NVML or the mock GPUs. No other package the plugin links may
// reach into the mock, so that a real node runs exactly the code the mock
// tests exercise.
func TestOnlyBackendImportsTheMock(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}} {{join .Imports " "}}`, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	const module = "github.com/tessera-dev/tessera/"
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, imports := fields[0], fields[1:]
		if !strings.HasPrefix(pkg, module) || pkg == module+"pkg/node/nvmlsource" || pkg == module+"pkg/gpu/nvmlmock" {
			continue
		}
		for _, imp := range imports {
			if imp == module+"pkg/gpu/nvmlmock" {
				t.Errorf("%s imports pkg/gpu/nvmlmock: reach the mock GPUs through pkg/node/nvmlsource", pkg)
			}
		}
	}
}

// The binaries link neither the trace replayer (hack/internal/sim, benchmark code)
// nor test fixtures (packages named *test, *testing or fake): what they
// need of either belongs in a package with a proper name.
func TestLinksNoBenchmarkOrFixtures(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	const module = "github.com/tessera-dev/tessera/"
	for _, pkg := range strings.Fields(string(out)) {
		rest, ours := strings.CutPrefix(pkg, module)
		if !ours {
			continue
		}
		last := rest[strings.LastIndex(rest, "/")+1:]
		if rest == "hack/internal/sim" || strings.HasPrefix(rest, "hack/internal/sim/") || strings.HasPrefix(rest, "hack/") ||
			strings.HasSuffix(last, "test") || strings.HasSuffix(last, "testing") || last == "fake" {
			t.Errorf("the binary links %s: benchmark code and test fixtures stay out of the binaries", pkg)
		}
	}
}
