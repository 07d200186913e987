package sim

import (
	"os/exec"
	"strings"
	"testing"
)

// The replayer is benchmark code built from the project's real packages;
// it links no test fixtures (packages named *test or *testing), so that
// what it measures is what ships.
func TestLinksNoFixtures(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		rest, ours := strings.CutPrefix(pkg, "github.com/tessera-dev/tessera/")
		if last := rest[strings.LastIndex(rest, "/")+1:]; ours && (strings.HasSuffix(last, "test") || strings.HasSuffix(last, "testing")) {
			t.Errorf("hack/internal/sim links %s: move what it needs into hack/internal/sim or a package with a proper name", pkg)
		}
	}
}
