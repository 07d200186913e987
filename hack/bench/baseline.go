package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// defaultBaselineRev is the last commit of 2026-11-25, before the wave of
// engine changes of 2026-11-27 to 29 (taint rules, charges that follow
// claims, faults per workload, reclaim; the engine split into files and
// moved to pkg/control/decide): make bench states what that wave costs
// the engine, measured against it in the same run.
const defaultBaselineRev = "3ccdef2e7f4ce46b5045c966042584953e913552"

// enginePackages are the places the decision engine has lived, newest
// first; a revision's admission benchmarks are in the first it has.
func enginePackages() []string {
	return []string{"./pkg/control/decide/", "./pkg/decide/", "./pkg/admission/"}
}

// baselineTree is another revision of the repository checked out in a
// temporary git worktree, so that its engine's benchmarks run in the same
// run as this code's.
type baselineTree struct {
	// repo is the repository the worktree belongs to ("" is the current
	// directory's); short and date name the revision in the report.
	repo, short, date string
	// tmp holds the worktree, root.
	tmp, root string
	// pkg is the revision's engine package, relative to root.
	pkg string
}

// openBaseline checks out rev in a temporary worktree of repo (detached,
// so that no branch is touched) and finds its engine package. The caller
// closes it; on error nothing is left behind.
func openBaseline(repo, rev string) (b *baselineTree, err error) {
	full, err := git(repo, "rev-parse", "--verify", "--quiet", rev+"^{commit}")
	if err != nil {
		return nil, fmt.Errorf("revision %q: %w", rev, err)
	}
	b = &baselineTree{repo: repo}
	if b.short, err = git(repo, "rev-parse", "--short", full); err != nil {
		return nil, err
	}
	if b.date, err = git(repo, "show", "-s", "--format=%cs", full); err != nil {
		return nil, err
	}
	if b.tmp, err = os.MkdirTemp("", "tessera-baseline-"); err != nil {
		return nil, err
	}
	b.root = filepath.Join(b.tmp, "src")
	defer func() {
		if err != nil {
			b.close()
			b = nil
		}
	}()
	if _, err = git(repo, "worktree", "add", "--detach", b.root, full); err != nil {
		return b, err
	}
	b.pkg, err = findEnginePackage(b.root)
	return b, err
}

// close removes the worktree and its registration in the repository. A
// nil baseline is none.
func (b *baselineTree) close() {
	if b == nil {
		return
	}
	if _, err := os.Stat(b.root); err == nil {
		if _, err := git(b.repo, "worktree", "remove", "--force", b.root); err != nil {
			// Left registered: `git worktree prune` forgets it once the
			// directory is gone.
			fmt.Fprintf(os.Stderr, "bench: remove the baseline worktree: %v\n", err)
		}
	}
	_ = os.RemoveAll(b.tmp)
}

// label names the revision in the report: "the code of 2026-11-25 (3ccdef2)".
func (b *baselineTree) label() string { return fmt.Sprintf("the code of %s (%s)", b.date, b.short) }

// bench is this code's benchmark run as the baseline runs it: the same
// benchmarks and iterations in the baseline's engine package and worktree.
// A nil baseline has none.
func (b *baselineTree) bench(g goBenchRun) *goBenchRun {
	if b == nil {
		return nil
	}
	g.pkg, g.dir = b.pkg, b.root
	return &g
}

// command is how a reader reproduces the baseline's figures of this
// code's benchmark run g.
func (b *baselineTree) command(g goBenchRun) string {
	return fmt.Sprintf("git worktree add --detach /tmp/base %s && cd /tmp/base && %s", b.short, b.bench(g).command())
}

// findEnginePackage is the first of enginePackages under root whose
// benchmarks include BenchmarkAdmission.
func findEnginePackage(root string) (string, error) {
	for _, pkg := range enginePackages() {
		data, err := os.ReadFile(filepath.Join(root, pkg, "bench_test.go"))
		if err == nil && bytes.Contains(data, []byte("func BenchmarkAdmission(")) {
			return pkg, nil
		}
	}
	return "", fmt.Errorf("no BenchmarkAdmission in %s", strings.Join(enginePackages(), ", "))
}

// git runs git in repo ("" is the current directory) and returns its
// output without the final newline.
func git(repo string, args ...string) (string, error) {
	if repo != "" {
		args = append([]string{"-C", repo}, args...)
	}
	var stderr bytes.Buffer
	cmd := exec.Command("git", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return "", errors.New("git " + strings.Join(args, " ") + ": " + msg)
	}
	return strings.TrimSpace(string(out)), nil
}
