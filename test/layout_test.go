// Package test holds the layout rules of the repository's tests and tools.
package test

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
		"gonum.org/v1/plot",                      // benchmark plots (hack/internal/sim.PlotBars, hack/bench)
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

// wing is where a package under pkg/ lives: the node side, the control
// side, the GPU model both read, the kubectl plugin, or a shared leaf
// (docs/architecture.md).
func wing(pkg string) string {
	for _, w := range []string{"pkg/node/", "pkg/control/", "pkg/gpu/", "pkg/kubectl/"} {
		if strings.HasPrefix(pkg, w) {
			return strings.TrimSuffix(w, "/")
		}
	}
	switch pkg {
	case "pkg/atomicfile", "pkg/cli", "pkg/featuregates", "pkg/keymutex":
		return "leaf"
	}
	return ""
}

// mayImport says which wings a wing's product code may import.
var mayImport = map[string][]string{
	"pkg/node":    {"pkg/node", "pkg/gpu", "leaf"},
	"pkg/control": {"pkg/control", "pkg/gpu", "leaf"},
	"pkg/gpu":     {"pkg/gpu", "leaf"},
	"pkg/kubectl": {"pkg/kubectl", "pkg/control", "pkg/gpu", "leaf"},
	"leaf":        {},
}

// TestWings: every package under pkg/ sits in a wing; the node side and
// the control side never import each other, the GPU model imports
// neither, shared leaves import nothing of Tessera's but the API and the
// shipped manifests, and nothing under pkg/ imports test/ or hack/ (tests
// may use test/testutil and test/apiserver). Tests may cross wings to
// check the contract between them.
func TestWings(t *testing.T) {
	const module = "github.com/tessera-dev/tessera/"
	out, err := exec.Command("go", "list", "-test", "-f", `{{.ImportPath}}|{{.ForTest}}|{{join .Imports " "}}`, "../pkg/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		parts := strings.SplitN(line, "|", 3)
		path, forTest, imports := parts[0], parts[1], parts[2]
		if strings.HasSuffix(path, ".test") {
			continue // the generated test main
		}
		pkg, _, _ := strings.Cut(strings.TrimPrefix(path, module), " ")
		pkg = strings.TrimSuffix(pkg, "_test")
		w := wing(pkg)
		if w == "" {
			t.Errorf("%s is in no wing: put it under pkg/node, pkg/control, pkg/gpu or pkg/kubectl, or name it a shared leaf here and in docs/architecture.md", pkg)
			continue
		}
		test := forTest != "" || strings.Contains(path, " [")
		for _, imp := range strings.Fields(imports) {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			imp = strings.TrimPrefix(imp, module)
			switch {
			case imp == "api/v1alpha1", imp == "deployments", strings.HasPrefix(imp, pkg):
				// The API and the shipped manifests are everyone's.
			case imp == "test/testutil" || imp == "test/apiserver":
				if !test {
					t.Errorf("%s imports %s outside its tests", pkg, imp)
				}
			case strings.HasPrefix(imp, "test/") || strings.HasPrefix(imp, "hack/"):
				t.Errorf("%s imports %s: product code and its tests use only test/testutil and test/apiserver", pkg, imp)
			case test && strings.HasPrefix(imp, "pkg/"):
				// Tests may cross wings to check a contract between
				// them: the published slices with the scheduler's
				// allocator, the decisions with the plugin's taints.
			default:
				iw := wing(imp)
				ok := false
				for _, a := range mayImport[w] {
					ok = ok || a == iw
				}
				if !ok {
					t.Errorf("%s (%s) imports %s (%s): the %s side may import only %v", pkg, w, imp, iw, w, mayImport[w])
				}
			}
		}
	}
}

// TestCommandsLinkTheirWing: the controller links no node code and no
// NVML; the kubelet plugin links no control-plane code; kubectl-tessera
// links no node code (its mock nodes come from the GPU model's mock NVML).
func TestCommandsLinkTheirWing(t *testing.T) {
	const module = "github.com/tessera-dev/tessera/"
	for _, tc := range []struct {
		cmd    string
		refuse []string
	}{
		{"cmd/controller", []string{module + "pkg/node/", module + "pkg/kubectl/", "github.com/NVIDIA/go-nvml"}},
		{"cmd/kubelet-plugin", []string{module + "pkg/control/", module + "pkg/kubectl/"}},
		{"cmd/kubectl-tessera", []string{module + "pkg/node/"}},
	} {
		out, err := exec.Command("go", "list", "-deps", "../"+tc.cmd).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", tc.cmd, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, r := range tc.refuse {
				if strings.HasPrefix(dep, r) {
					t.Errorf("%s links %s", tc.cmd, dep)
				}
			}
		}
	}
}

// TestNoBuildOutputTracked: git tracks no compiled executable or object
// (ELF, Mach-O, PE, archives) and no file over 2 MB: built binaries are
// most of a repository's size once committed, and `go build` in the root
// leaves one (.gitignore covers the known outputs; this catches the rest).
func TestNoBuildOutputTracked(t *testing.T) {
	const maxSize = 2 << 20
	out, err := exec.Command("git", "-C", "..", "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files (the check needs a git checkout): %v", err)
	}
	magics := map[string][]byte{
		"an ELF binary":   []byte("\x7fELF"),
		"a Mach-O binary": {0xcf, 0xfa, 0xed, 0xfe},
		"a PE binary":     []byte("MZ"),
		"an ar archive":   []byte("!<arch>\n"),
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		path := filepath.Join("..", name)
		fi, err := os.Lstat(path)
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the work tree, or a link
		}
		if fi.Size() > maxSize {
			t.Errorf("%s is tracked and %d MB: build outputs and large data stay out of git", name, fi.Size()>>20)
		}
		head := make([]byte, 8)
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := f.Read(head)
		f.Close()
		for what, magic := range magics {
			if n >= len(magic) && bytes.Equal(head[:len(magic)], magic) {
				t.Errorf("%s is tracked and is %s: remove it (git rm --cached) and ignore it", name, what)
			}
		}
	}
}

// TestNoRacePackagesStartNoGoroutines: the packages `make unit` tests
// without the race detector (NORACE_PKGS in the Makefile) start no
// goroutine of their own (no go statement, no errgroup or
// sync.WaitGroup.Go): the race detector could find nothing there. A
// package that starts one must leave the list.
func TestNoRacePackagesStartNoGoroutines(t *testing.T) {
	makefile, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^NORACE_PKGS\s*:=\s*(.+)$`).FindSubmatch(makefile)
	if m == nil {
		t.Fatal("the Makefile has no NORACE_PKGS")
	}
	args := append([]string{"list", "-f", `{{.Dir}}|{{join .GoFiles " "}}`}, strings.Fields(string(m[1]))...)
	cmd := exec.Command("go", args...)
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	fset := token.NewFileSet()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		dir, files, _ := strings.Cut(line, "|")
		for _, name := range strings.Fields(files) {
			f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				if strings.Contains(imp.Path.Value, "errgroup") {
					t.Errorf("%s imports errgroup: it starts goroutines; remove its package from NORACE_PKGS", fset.Position(imp.Pos()))
				}
			}
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.GoStmt:
					t.Errorf("%s starts a goroutine: remove its package from NORACE_PKGS", fset.Position(n.Pos()))
				case *ast.SelectorExpr:
					if n.Sel.Name == "Go" {
						t.Errorf("%s calls .Go (a goroutine): remove its package from NORACE_PKGS", fset.Position(n.Pos()))
					}
				}
				return true
			})
		}
	}
}
