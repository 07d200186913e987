package interposercache

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2/ktesting"
)

func mountable(t *testing.T, d Dirs) {
	t.Helper()
	if err := d.Probe(); err != nil {
		t.Skipf("cannot mount here (tests need root with CAP_SYS_ADMIN): %v", err)
	}
}

func TestTmpfsPerClaim(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d := Dirs{Root: filepath.Join(t.TempDir(), "accounting"), Size: 1 << 20}
	mountable(t, d)
	t.Cleanup(func() { _ = d.Remove(ctx, "uid-1"); _ = d.Remove(ctx, "uid-2") })

	dir, err := d.Create(ctx, "uid-1")
	if err != nil {
		t.Fatal(err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type != unix.TMPFS_MAGIC {
		t.Fatalf("file system type %#x, want tmpfs", fs.Type)
	}
	if got := uint64(fs.Blocks) * uint64(fs.Bsize); got != 1<<20 {
		t.Errorf("size %d, want %d", got, 1<<20)
	}
	if fs.Flags&(unix.ST_NOSUID|unix.ST_NODEV|unix.ST_NOEXEC) != unix.ST_NOSUID|unix.ST_NODEV|unix.ST_NOEXEC {
		t.Errorf("mount flags %#x lack nosuid, nodev, noexec", fs.Flags)
	}
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o777 || st.Mode()&os.ModeSticky == 0 {
		t.Errorf("mode %v, want drwxrwxrwt", st.Mode())
	}
	// The size is a bound: writing more than it fails.
	err = os.WriteFile(filepath.Join(dir, "big"), bytes.Repeat([]byte{1}, 2<<20), 0o600)
	if !errors.Is(err, unix.ENOSPC) {
		t.Errorf("writing 2 MiB into a 1 MiB directory: %v, want ENOSPC", err)
	}
	if err := os.Remove(filepath.Join(dir, "big")); err != nil {
		t.Fatal(err)
	}
	// Another claim's directory is separate.
	dir2, err := d.Create(ctx, "uid-2")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir2, "x"), []byte("x"), 0o600); err != nil {
		t.Errorf("claim 2's directory is filled by claim 1's: %v", err)
	}

	// Re-prepare (or a crash before unprepare, with a mount stacked on
	// top): Create starts empty with exactly one mount.
	if err := os.WriteFile(filepath.Join(dir, "stale.cache"), []byte("old limits"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4k"); err != nil {
		t.Fatal(err)
	}
	dir, err = d.Create(ctx, "uid-1")
	if err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("re-created directory is not empty: %v", entries)
	}
	if err := unix.Statfs(dir, &fs); err != nil || uint64(fs.Blocks)*uint64(fs.Bsize) != 1<<20 {
		t.Errorf("re-created directory: size %d, %v", uint64(fs.Blocks)*uint64(fs.Bsize), err)
	}

	// Remove unmounts and removes; twice is fine.
	for i := 0; i < 2; i++ {
		if err := d.Remove(ctx, "uid-1"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory left after Remove: %v", err)
	}
	if mounted, err := IsMountPoint(d.Root); err != nil || mounted {
		t.Errorf("root is a mount point: %v %v", mounted, err)
	}

	// Ensure restores a lost directory, leaves an existing one alone.
	if err := os.WriteFile(filepath.Join(dir2, "keep"), []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.Ensure(ctx, "uid-2"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir2, "keep")); err != nil {
		t.Errorf("Ensure replaced a live directory: %v", err)
	}
	if err := d.Ensure(ctx, "uid-1"); err != nil {
		t.Fatal(err)
	}
	if mounted, _ := IsMountPoint(d.Path("uid-1")); !mounted {
		t.Error("Ensure did not mount the lost directory")
	}
}

func TestUnbounded(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d := Dirs{Root: t.TempDir(), Unbounded: true}
	dir, err := d.Create(ctx, "uid-1")
	if err != nil {
		t.Fatal(err)
	}
	if mounted, err := IsMountPoint(dir); err != nil || mounted {
		t.Errorf("unbounded directory is a mount: %v %v", mounted, err)
	}
	st, err := os.Stat(dir)
	if err != nil || st.Mode()&os.ModeSticky == 0 || st.Mode().Perm() != 0o777 {
		t.Errorf("mode %v %v", st.Mode(), err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if dir, err = d.Create(ctx, "uid-1"); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("not fresh: %v", entries)
	}
	if err := d.Remove(ctx, "uid-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("left: %v", err)
	}
}
