package driverfiles_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/pkg/node/driverfiles"
)

func TestInstallHook(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "image", driverfiles.HookName)
	if err := os.MkdirAll(filepath.Dir(src), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src, []byte("v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(dir, "host", "bin")
	got, err := driverfiles.InstallHook(src, host)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(host, driverfiles.HookName); got != want {
		t.Fatalf("installed at %s, want %s", got, want)
	}
	st, err := os.Stat(got)
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("installed hook: %v %v", st, err)
	}
	// A new image: the host copy follows.
	if err := os.WriteFile(src, []byte("v2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := driverfiles.InstallHook(src, host); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(got); string(b) != "v2" {
		t.Errorf("host copy %q after an upgrade, want v2", b)
	}
	entries, _ := os.ReadDir(host)
	if len(entries) != 1 {
		t.Errorf("temporary files left in %s: %v", host, entries)
	}
	if _, err := driverfiles.InstallHook(filepath.Join(dir, "none"), host); err == nil || !strings.Contains(err.Error(), "--nvidia-cdi-hook-path") {
		t.Errorf("missing hook: %v, want an error naming --nvidia-cdi-hook-path", err)
	}
}
