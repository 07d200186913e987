package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The data path reads top-down (discover → model → publish → prepare →
// CDI) over nvml.Interface; only pkg/backend decides whether that is the
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
		if !strings.HasPrefix(pkg, module) || pkg == module+"pkg/backend" || pkg == module+"pkg/nvmlmock" {
			continue
		}
		for _, imp := range imports {
			if imp == module+"pkg/nvmlmock" {
				t.Errorf("%s imports pkg/nvmlmock: reach the mock GPUs through pkg/backend", pkg)
			}
		}
	}
}
