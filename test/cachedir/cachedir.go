// Package cachedir names the directory where the test harnesses cache the
// binaries they build (kube-apiserver, etcd, helm...) and their build
// modules.
package cachedir

import (
	"os"
	"path/filepath"
)

// Dir is ${TESSERA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}.
func Dir() string {
	if d := os.Getenv("TESSERA_CACHE_DIR"); d != "" {
		return d
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil || home == "" {
			home = "/root"
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "tessera")
}
