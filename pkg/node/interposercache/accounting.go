// Package interposercache manages the per-claim directories that hold the CUDA
// interposer's shared accounting file (CUDA_DEVICE_MEMORY_SHARED_CACHE).
//
// Each claim gets <root>/<claimUID>, and where the plugin may mount, that
// directory is its own tmpfs with a size limit (nosuid, nodev, noexec): a
// tenant can fill it, but only up to the limit, and never the node's disk.
// It is world-writable with the sticky bit (mode 1777) because the
// container's processes may run as any user and must all create and map
// the same file; only that claim's containers mount it.
//
// Create is idempotent across crashes: whatever a previous preparation left
// (a mounted tmpfs, stacked mounts, files) is unmounted and removed first,
// so every preparation starts empty. Remove unmounts and removes.
package interposercache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// DefaultSize bounds one claim's directory. HAMi-core's shared region (1024
// process slots of 16 devices) is under 2 MiB.
const DefaultSize = 16 << 20

// Mode of a claim's directory: any user of the container may create the
// accounting file; the sticky bit keeps users from removing each other's.
const Mode = 0o1777

// Dirs are the accounting directories under Root.
type Dirs struct {
	// Root holds one directory per claim UID.
	Root string
	// Size is the size limit of each claim's tmpfs in bytes.
	Size uint64
	// Unbounded makes plain directories instead of tmpfs mounts, for a
	// plugin that may not mount (see Probe).
	Unbounded bool
}

// Path is the directory of a claim.
func (d Dirs) Path(uid string) string { return filepath.Join(d.Root, uid) }

// Probe reports whether the plugin may mount a tmpfs under Root: it mounts
// and unmounts one. A plugin without CAP_SYS_ADMIN (the chart's
// unprivileged mock mode) gets EPERM.
func (d Dirs) Probe() error {
	if err := os.MkdirAll(d.Root, 0o755); err != nil {
		return err
	}
	probe, err := os.MkdirTemp(d.Root, ".probe-")
	if err != nil {
		return err
	}
	defer os.Remove(probe)
	if err := unix.Mount("tmpfs", probe, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0700"); err != nil {
		return fmt.Errorf("mount a tmpfs on %s: %w", probe, err)
	}
	return unix.Unmount(probe, unix.MNT_DETACH)
}

// Create makes the claim's directory fresh and empty: what an earlier
// preparation or a crash left is unmounted and removed first.
func (d Dirs) Create(ctx context.Context, uid string) (string, error) {
	dir := d.Path(uid)
	if err := d.Remove(ctx, uid); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("accounting directory: %w", err)
	}
	if !d.Unbounded {
		size := d.Size
		if size == 0 {
			size = DefaultSize
		}
		opts := "size=" + strconv.FormatUint(size, 10) + ",mode=" + strconv.FormatUint(Mode, 8)
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
			_ = os.Remove(dir)
			return "", fmt.Errorf("mount the accounting tmpfs on %s: %w", dir, err)
		}
		return dir, nil
	}
	// Unbounded: a plain directory. Containers may run as any user.
	if err := os.Chmod(dir, os.ModeSticky|0o777); err != nil {
		return "", err
	}
	return dir, nil
}

// Ensure restores a prepared claim's directory when it went missing (a
// plugin restart keeps mounts; a lost one is made again, empty).
func (d Dirs) Ensure(ctx context.Context, uid string) error {
	dir := d.Path(uid)
	if _, err := os.Stat(dir); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	_, err := d.Create(ctx, uid)
	return err
}

// Remove unmounts the claim's directory (every mount stacked on it) and
// removes it. A missing directory is fine.
func (d Dirs) Remove(ctx context.Context, uid string) error {
	return RemoveDir(ctx, d.Path(uid))
}

// RemoveDir unmounts dir (every mount stacked on it) and removes it. A
// missing directory is fine.
func RemoveDir(ctx context.Context, dir string) error {
	for i := 0; ; i++ {
		mounted, err := IsMountPoint(dir)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if !mounted {
			break
		}
		if i >= 16 {
			return fmt.Errorf("accounting directory %s is still a mount point after %d unmounts", dir, i)
		}
		// Detach: a container that still has it open keeps its view;
		// the directory is gone for everyone else.
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount accounting directory %s: %w", dir, err)
		}
		klog.FromContext(ctx).V(4).Info("Unmounted accounting directory", "dir", dir)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove accounting directory: %w", err)
	}
	return nil
}

// IsMountPoint says whether dir is mounted on: its device differs from its
// parent's (bind mounts of the same file system are not detected, and none
// is made here).
func IsMountPoint(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, os.ErrNotExist
		}
		return false, err
	}
	if err := unix.Lstat(filepath.Dir(dir), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}
