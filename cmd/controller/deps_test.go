package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The controller image ships a static, pure-Go binary (CGO_ENABLED=0), and
// go-nvml does not compile without cgo. Anything the controller imports must
// therefore reason about devices through pkg/gpu/inventory and the device names,
// never through pkg/gpu/discover or go-nvml.
func TestControllerLinksNoNVML(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/NVIDIA/go-nvml") || strings.HasSuffix(pkg, "/pkg/discover") {
			t.Errorf("cmd/controller depends on %s: it must build with CGO_ENABLED=0 (move what it needs into a package without NVML, e.g. pkg/gpu/inventory)", pkg)
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
