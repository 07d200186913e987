package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testRepo is a git repository with one commit holding files.
func testRepo(t *testing.T, files map[string]string) string {
	t.Helper()
	repo := t.TempDir()
	for path, content := range files {
		p := filepath.Join(repo, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{
		{"init", "-q"},
		{"add", "."},
		{"-c", "user.name=bench", "-c", "user.email=bench@example.com", "commit", "-q", "-m", "base"},
	} {
		if _, err := git(repo, args...); err != nil {
			t.Fatal(err)
		}
	}
	return repo
}

func TestFindEnginePackage(t *testing.T) {
	bench := "package x\n\nfunc BenchmarkAdmission(b *testing.B) {}\n"
	tests := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"today", map[string]string{"pkg/control/decide/bench_test.go": bench}, "./pkg/control/decide/"},
		{"2026-11-27", map[string]string{"pkg/decide/bench_test.go": bench}, "./pkg/decide/"},
		{"2026-11-25", map[string]string{"pkg/admission/bench_test.go": bench}, "./pkg/admission/"},
		// A package without the benchmark is passed over.
		{"newest with it", map[string]string{"pkg/control/decide/bench_test.go": "package x\n", "pkg/admission/bench_test.go": bench}, "./pkg/admission/"},
		{"none", map[string]string{"pkg/other/bench_test.go": bench}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for path, content := range tc.files {
				p := filepath.Join(root, path)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := findEnginePackage(root)
			if got != tc.want || (err != nil) != (tc.want == "") {
				t.Errorf("findEnginePackage = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestOpenBaseline(t *testing.T) {
	repo := testRepo(t, map[string]string{"pkg/admission/bench_test.go": "package admission_test\n\nfunc BenchmarkAdmission(b *testing.B) {}\n"})
	b, err := openBaseline(repo, "HEAD")
	if err != nil {
		t.Fatal(err)
	}
	if b.pkg != "./pkg/admission/" || len(b.short) < 7 || len(b.date) != len("2026-11-25") {
		t.Errorf("baseline %+v", b)
	}
	if _, err := os.Stat(filepath.Join(b.root, "pkg/admission/bench_test.go")); err != nil {
		t.Errorf("the worktree lacks the revision's files: %v", err)
	}
	cur := goBenchRun{pkg: "./pkg/control/decide/", pattern: enginePattern, benchtime: "2x"}
	g := b.bench(cur)
	if g.pkg != "./pkg/admission/" || g.dir != b.root || g.pattern != enginePattern || g.benchtime != "2x" {
		t.Errorf("the baseline's run %+v", g)
	}
	if want := "git worktree add --detach /tmp/base " + b.short + " && cd /tmp/base && go test -run='^$' -bench='" + enginePattern + "' -benchtime=2x ./pkg/admission/"; b.command(cur) != want {
		t.Errorf("command %q, want %q", b.command(cur), want)
	}
	b.close()
	if _, err := os.Stat(b.tmp); !os.IsNotExist(err) {
		t.Errorf("the worktree's directory is left: %v", err)
	}
	if list, _ := git(repo, "worktree", "list"); strings.Count(list, "\n") != 0 {
		t.Errorf("the worktree is still registered:\n%s", list)
	}
	var none *baselineTree
	none.close()
	if none.bench(goBenchRun{}) != nil {
		t.Error("no baseline has a run")
	}
}

func TestOpenBaselineFails(t *testing.T) {
	tests := []struct {
		name, rev, want string
		files           map[string]string
	}{
		{"unknown revision", "no-such-rev", `revision "no-such-rev"`, map[string]string{"README": "x\n"}},
		{"no engine", "HEAD", "no BenchmarkAdmission", map[string]string{"README": "x\n"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			repo := testRepo(t, tc.files)
			before, _ := filepath.Glob(filepath.Join(os.TempDir(), "tessera-baseline-*"))
			b, err := openBaseline(repo, tc.rev)
			if b != nil || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("openBaseline = %+v, %v; want an error with %q", b, err, tc.want)
			}
			after, _ := filepath.Glob(filepath.Join(os.TempDir(), "tessera-baseline-*"))
			if list, _ := git(repo, "worktree", "list"); len(after) != len(before) || strings.Count(list, "\n") != 0 {
				t.Errorf("left behind: %v, worktrees:\n%s", after, list)
			}
		})
	}
}
