package driverfiles

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/tessera-dev/tessera/pkg/atomicfile"
)

// HookName is the NVIDIA CDI hook's executable name.
const HookName = "nvidia-cdi-hook"

// BundledHook is where the plugin's image has the hook: next to the
// plugin's own executable.
func BundledHook() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(self), HookName), nil
}

// InstallHook copies the hook executable src into dir and returns its path
// there. The container runtime runs OCI hooks in the host's mount
// namespace, so the path a spec names must exist on the host: dir is a
// host directory the plugin sees at the same path (the plugin data
// directory). The copy is atomic (temporary file, fsync, rename), so a
// runtime starting a container meanwhile runs either the old or the new
// hook; an identical file is left alone.
func InstallHook(src, dir string) (string, error) {
	data, err := os.ReadFile(src)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%s is not in the plugin's image at %s: set --nvidia-cdi-hook-path to the hook on the host", HookName, src)
	}
	if err != nil {
		return "", fmt.Errorf("read %s: %w", HookName, err)
	}
	dst := filepath.Join(dir, HookName)
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, data) {
		return dst, nil
	}
	if err := atomicfile.Write(dst, data, 0o755); err != nil {
		return "", fmt.Errorf("install %s into %s: %w", HookName, dir, err)
	}
	return dst, nil
}
