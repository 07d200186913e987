// Package schedperf prepares and drives kube-scheduler's own benchmark,
// test/integration/scheduler_perf of k8s.io/kubernetes, for make
// bench-upstream: it turns the module proxy's k8s.io/kubernetes source into a
// tree that builds on its own, generates the test cases (upstream's test
// driver slices, Tessera's slices, plain pods) and reads the results.
package schedperf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

const (
	// KubernetesVersion is the k8s.io/kubernetes release whose scheduler_perf runs.
	KubernetesVersion = "v1.37.2"
	// StagingVersion is the published version of its staging modules
	// (k8s.io/api, k8s.io/client-go, ...).
	StagingVersion = "v0.37.2"
	// preparedMark is written last into a prepared tree; its content is the
	// versions, so a tree prepared for other versions is rebuilt.
	preparedMark  = ".tessera-prepared"
	stagingPrefix = "./staging/src/"
)

// modEdit is the part of `go mod edit -json` that the rewrite reads.
type modEdit struct {
	Replace []struct {
		Old struct{ Path, Version string }
		New struct{ Path, Version string }
	}
}

// ReplaceArgs reads the output of `go mod edit -json` of k8s.io/kubernetes
// and returns the `go mod edit` flags that point every replace of a staging
// module at its directory (k8s.io/api => ./staging/src/k8s.io/api) at the
// published module instead (k8s.io/api => k8s.io/api version). The module
// zip of k8s.io/kubernetes leaves staging/ out, so without this the tree does
// not build. Replaces of other modules are left alone.
func ReplaceArgs(modJSON []byte, version string) ([]string, error) {
	if version == "" {
		return nil, errors.New("staging version is empty: pass the k8s.io/* module version, e.g. " + StagingVersion)
	}
	var m modEdit
	if err := json.Unmarshal(modJSON, &m); err != nil {
		return nil, fmt.Errorf("reading `go mod edit -json` output: %w", err)
	}
	var args []string
	for _, r := range m.Replace {
		if !strings.HasPrefix(r.New.Path, stagingPrefix) {
			continue
		}
		if want := stagingPrefix + r.Old.Path; r.New.Path != want || r.Old.Version != "" {
			return nil, fmt.Errorf("replace %s %s => %s: expected %s => %s (a staging module replaced by its directory)", r.Old.Path, r.Old.Version, r.New.Path, r.Old.Path, want)
		}
		args = append(args, fmt.Sprintf("-replace=%s=%s@%s", r.Old.Path, r.Old.Path, version))
	}
	if len(args) == 0 {
		return nil, errors.New("go.mod replaces no module by a ./staging/src/ directory: not the k8s.io/kubernetes go.mod, or already rewritten")
	}
	return args, nil
}

// Logf is how the harness reports progress.
type Logf func(format string, args ...any)

// TreeDir is where the prepared k8s.io/kubernetes tree lives under cacheDir.
func TreeDir(cacheDir string) string {
	return filepath.Join(cacheDir, "bench-upstream", "kubernetes-"+KubernetesVersion)
}

// Prepare makes TreeDir(cacheDir) a k8s.io/kubernetes KubernetesVersion tree
// that builds as a module of its own: the module proxy's source, writable,
// without go.work and vendor/ (both name the staging directories the zip
// lacks), its staging replaces pointing at StagingVersion, and go.sum
// completed. A tree already prepared is reused as it is.
func Prepare(ctx context.Context, logf Logf, cacheDir string) (string, error) {
	dir := TreeDir(cacheDir)
	mark := KubernetesVersion + " " + StagingVersion + "\n"
	if data, err := os.ReadFile(filepath.Join(dir, preparedMark)); err == nil && string(data) == mark {
		logf("reusing the prepared tree %s", dir)
		return dir, nil
	}
	logf("preparing k8s.io/kubernetes@%s in %s (downloads it from the module proxy once)", KubernetesVersion, dir)
	out, err := goCmd(ctx, "", "mod", "download", "-json", "k8s.io/kubernetes@"+KubernetesVersion)
	if err != nil {
		return "", err
	}
	var dl struct{ Dir, Error string }
	if err := json.Unmarshal(out, &dl); err != nil {
		return "", fmt.Errorf("reading `go mod download -json` output: %w", err)
	}
	if dl.Error != "" || dl.Dir == "" {
		return "", fmt.Errorf("downloading k8s.io/kubernetes@%s: %s", KubernetesVersion, dl.Error)
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(tmp), 0o755); err != nil {
		return "", err
	}
	// CopyFS makes the copies writable (the module cache is read-only).
	if err := os.CopyFS(tmp, os.DirFS(dl.Dir)); err != nil {
		return "", fmt.Errorf("copying %s: %w", dl.Dir, err)
	}
	for _, p := range []string{"go.work", "go.work.sum", "vendor"} {
		if err := os.RemoveAll(filepath.Join(tmp, p)); err != nil {
			return "", err
		}
	}
	modJSON, err := goCmd(ctx, tmp, "mod", "edit", "-json")
	if err != nil {
		return "", err
	}
	args, err := ReplaceArgs(modJSON, StagingVersion)
	if err != nil {
		return "", err
	}
	if _, err := goCmd(ctx, tmp, append([]string{"mod", "edit"}, args...)...); err != nil {
		return "", err
	}
	// go.sum has no entries for the published staging modules yet: record
	// their go.mod hashes (-mod=mod), then their zips.
	replaced, err := goCmd(ctx, tmp, "list", "-mod=mod", "-m", "-f", "{{if .Replace}}{{.Path}}{{end}}", "all")
	if err != nil {
		return "", err
	}
	if _, err := goCmd(ctx, tmp, append([]string{"mod", "download"}, strings.Fields(string(replaced))...)...); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(tmp, preparedMark), []byte(mark), 0o644); err != nil {
		return "", err
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// goCmd runs the go command in dir and returns its standard output; its
// error carries the standard error.
func goCmd(ctx context.Context, dir string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s (in %s): %w: %s", strings.Join(args, " "), dir, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
