package apiserver

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAssetsFindsTheNewestBuiltBinaries: without $KUBEBUILDER_ASSETS the
// binaries are the newest ones under <cache>/bin; a missing one is
// ErrNoBinaries naming it and the fix.
func TestAssetsFindsTheNewestBuiltBinaries(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("TESSERA_CACHE_DIR", cache)
	t.Setenv("KUBEBUILDER_ASSETS", "")
	put := func(rel string) string {
		p := filepath.Join(cache, "bin", rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	put("kubernetes-v1.36.0/kube-apiserver")
	apiserver := put("kubernetes-v1.37.1/kube-apiserver")
	put("kubernetes-v1.37.1/kubectl")

	_, err := assets(t.TempDir())
	if !errors.Is(err, ErrNoBinaries) || !strings.Contains(err.Error(), "etcd") || !strings.Contains(err.Error(), "make cluster-build") {
		t.Fatalf("without etcd: %v", err)
	}
	put("etcd-v3.6.16/etcd")
	dir, err := assets(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.Readlink(filepath.Join(dir, "kube-apiserver")); got != apiserver {
		t.Errorf("kube-apiserver -> %s, want %s", got, apiserver)
	}
	for _, name := range []string{"etcd", "kubectl"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Error(err)
		}
	}

	t.Setenv("KUBEBUILDER_ASSETS", "/opt/assets")
	if dir, err := assets(t.TempDir()); dir != "/opt/assets" || err != nil {
		t.Errorf("KUBEBUILDER_ASSETS: %s %v", dir, err)
	}
}
