package imagebuild

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"path"
	"slices"
	"strings"
)

// Files is an image's file system: absolute path to entry.
type Files map[string]file

type file struct {
	mode int64
	data []byte
	dir  bool
	link string // symbolic link target
	uid  int
	gid  int
}

// IsExecutable tells whether p is a regular file with an execute bit.
func (fs Files) IsExecutable(p string) bool {
	f, ok := fs[p]
	return ok && !f.dir && f.link == "" && f.mode&0o111 != 0
}

// Data is the content of the regular file at p (symbolic links followed
// inside the image).
func (fs Files) Data(p string) ([]byte, error) {
	_, f, err := fs.resolve(p)
	if err != nil {
		return nil, err
	}
	if f.dir {
		return nil, fmt.Errorf("%s is a directory", p)
	}
	return f.data, nil
}

// resolve follows symbolic links inside the image (never on this machine)
// and returns the final path and entry.
func (fs Files) resolve(p string) (string, file, error) {
	p = path.Clean("/" + p)
	for range 40 {
		parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
		cur, followed := "/", false
		for i, part := range parts {
			next := path.Join(cur, part)
			f, ok := fs[next]
			if !ok {
				return "", file{}, fmt.Errorf("%s: %w in the image", p, iofs.ErrNotExist)
			}
			if f.link != "" {
				target := f.link
				if !path.IsAbs(target) {
					target = path.Join(cur, target)
				}
				p = path.Join(append([]string{target}, parts[i+1:]...)...)
				followed = true
				break
			}
			cur = next
		}
		if !followed {
			return p, fs[p], nil
		}
	}
	return "", file{}, fmt.Errorf("%s: too many levels of symbolic links", p)
}

// ReadLayer reads an uncompressed layer tar (or a flattened image
// file system) into Files.
func ReadLayer(r io.Reader) (Files, error) {
	fs := Files{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return fs, nil
		}
		if err != nil {
			return nil, err
		}
		name := path.Clean("/" + h.Name)
		if name == "/" {
			continue
		}
		f := file{mode: h.Mode & 0o7777, uid: h.Uid, gid: h.Gid}
		switch h.Typeflag {
		case tar.TypeDir:
			f.dir = true
		case tar.TypeReg:
			if f.data, err = io.ReadAll(tr); err != nil {
				return nil, err
			}
		case tar.TypeSymlink:
			f.link = h.Linkname
		default:
			return nil, fmt.Errorf("%s: unexpected tar type %q", name, h.Typeflag)
		}
		fs[name] = f
	}
}

// glibcCompanions are loaded by glibc or by libraries the plugin dlopens
// (libnvidia-ml.so.1 needs libm, libdl, libpthread and librt). They must come
// from the same glibc as libc.so.6: an image with libc.so.6 must have them.
var glibcCompanions = []string{"libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"}

// libraryDirs are the dynamic loader's default search directories on
// Debian (multiarch first); the image has no ld.so.cache.
func libraryDirs(goarch string) []string {
	triplet := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[goarch]
	return []string{"/lib/" + triplet, "/usr/lib/" + triplet, "/lib", "/usr/lib"}
}

// Verify checks that each binary in BinDir is an executable and that it can
// start inside the image: its ELF interpreter and the transitive closure of
// its DT_NEEDED libraries resolve in the image's library directories (links
// followed inside the image, never on this machine), every symbol version
// they need (GLIBC_2.34, ...) is defined by the library the image holds,
// and with libc.so.6 come glibcCompanions.
func Verify(fs Files, goarch string, binaries []string) error {
	var errs []error
	for _, b := range binaries {
		if err := verifyBinary(fs, goarch, path.Join(BinDir, b)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func verifyBinary(fs Files, goarch, bin string) error {
	if !fs.IsExecutable(bin) {
		return fmt.Errorf("%s: not an executable regular file in the image", bin)
	}
	f, err := elf.NewFile(bytes.NewReader(fs[bin].data))
	if err != nil {
		return fmt.Errorf("%s: not an ELF binary: %w", bin, err)
	}
	interp := ""
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return fmt.Errorf("%s: reading PT_INTERP: %w", bin, err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	if interp == "" {
		return nil // static
	}
	if _, err := fs.Data(interp); err != nil {
		return fmt.Errorf("%s: ELF interpreter: %w", bin, err)
	}
	type object struct {
		name string
		f    *elf.File
	}
	loaded := map[string]*elf.File{}
	queue := []object{{bin, f}}
	var errs []error
	for len(queue) > 0 {
		o := queue[0]
		queue = queue[1:]
		needed, err := o.f.ImportedLibraries()
		if err != nil {
			return fmt.Errorf("%s: %s: DT_NEEDED: %w", bin, o.name, err)
		}
		if slices.Contains(needed, "libc.so.6") {
			needed = append(needed, glibcCompanions...)
		}
		for _, lib := range needed {
			if _, ok := loaded[lib]; ok {
				continue
			}
			lf, err := findLibrary(fs, goarch, lib)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s needs %s (via %s): %w", bin, lib, o.name, err))
				continue
			}
			loaded[lib] = lf
			queue = append(queue, object{lib, lf})
		}
	}
	// Symbol versions: what each object needs, against what the loaded
	// library defines.
	check := func(name string, o *elf.File) {
		needs, err := o.DynamicVersionNeeds()
		if err != nil {
			return // no SHT_GNU_verneed section
		}
		for _, n := range needs {
			lib, ok := loaded[n.Name]
			if !ok {
				continue // reported above
			}
			defs, _ := lib.DynamicVersions()
			for _, v := range n.Needs {
				if !slices.ContainsFunc(defs, func(d elf.DynamicVersion) bool { return d.Name == v.Dep }) {
					errs = append(errs, fmt.Errorf("%s: %s needs %s from %s, which the image's %s does not define: it was linked against a newer library than the one pinned in %s", bin, name, v.Dep, n.Name, n.Name, ManifestPath))
				}
			}
		}
	}
	check(bin, f)
	for name, lf := range loaded {
		check(name, lf)
	}
	return errors.Join(errs...)
}

func findLibrary(fs Files, goarch, name string) (*elf.File, error) {
	for _, d := range libraryDirs(goarch) {
		data, err := fs.Data(path.Join(d, name))
		if err != nil {
			continue
		}
		return elf.NewFile(bytes.NewReader(data))
	}
	return nil, fmt.Errorf("not found in the image's %v", libraryDirs(goarch))
}
