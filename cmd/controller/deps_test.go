package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The controller image ships a static, pure-Go binary (CGO_ENABLED=0), and
// go-nvml does not compile without cgo. Anything the controller imports must
// therefore reason about devices through pkg/inventory and the device names,
// never through pkg/discover or go-nvml.
func TestControllerLinksNoNVML(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/NVIDIA/go-nvml") || strings.HasSuffix(pkg, "/pkg/discover") {
			t.Errorf("cmd/controller depends on %s: it must build with CGO_ENABLED=0 (move what it needs into a package without NVML, e.g. pkg/inventory)", pkg)
		}
	}
}
