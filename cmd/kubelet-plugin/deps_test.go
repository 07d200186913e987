package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The data path reads top-down (discover → model → publish → prepare →
// CDI) over nvml.Interface; only pkg/node/nvmlsource decides whether that is the
// node's NVML or the mock GPUs. No other package of the node side (or this
// command) may reach into the mock, so that a real node runs exactly the
// code the mock tests exercise. (The GPU model's pkg/gpu/nodeslices offers
// tools a mock node's slices, nodeslices.Mock; the plugin never calls it.)
func TestOnlyBackendImportsTheMock(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}} {{join .Imports " "}}`, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	const module = "github.com/tessera-dev/tessera/"
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, imports := fields[0], fields[1:]
		nodeSide := strings.HasPrefix(pkg, module+"pkg/node/") || strings.HasPrefix(pkg, module+"cmd/")
		if !nodeSide || pkg == module+"pkg/node/nvmlsource" {
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
