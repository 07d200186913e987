package imagebuild

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// DefaultDebCache is where fetched .deb files are kept:
// ~/.cache/tessera/debs.
func DefaultDebCache() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "tessera", "debs")
}

// fetchDeb returns the path of p's .deb for arch in cacheDir, downloading it
// when the cache lacks it: with `apt-get download` when apt lists the pinned
// version (and the SHA256 that apt's signed package index lists equals the
// pin), else from mirror/<filename>. Either way the file's SHA256 must equal
// the manifest's pin.
func fetchDeb(ctx context.Context, p Package, arch, mirror, cacheDir string, logf func(string, ...any)) (string, error) {
	want, ok := p.SHA256[arch]
	if !ok {
		return "", fmt.Errorf("%s: %s has no sha256 for architecture %s; add it from `apt-cache show %s:%s=%s`", ManifestPath, p.Name, arch, p.Name, arch, p.Version)
	}
	file := filepath.Join(cacheDir, fmt.Sprintf("%s_%s_%s.deb", p.Name, strings.ReplaceAll(p.Version, ":", "%3a"), arch))
	if got, err := fileSHA256(file); err == nil && got == want {
		return file, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(cacheDir, "download-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	spec := fmt.Sprintf("%s:%s=%s", p.Name, arch, p.Version)
	var deb string
	listed, aptErr := aptSHA256(ctx, spec)
	switch {
	case aptErr == nil && listed != want:
		return "", fmt.Errorf("%s: %s: sha256 pin %s, but apt's package index lists %s: fix the pin", ManifestPath, spec, want, listed)
	case aptErr == nil:
		logf("apt-get download %s", spec)
		cmd := exec.CommandContext(ctx, "apt-get", "download", "-q", spec)
		cmd.Dir = tmp
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("apt-get download %s: %w\n%s", spec, err, b)
		}
		debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
		if len(debs) != 1 {
			return "", fmt.Errorf("apt-get download %s wrote %d .deb files, want 1", spec, len(debs))
		}
		deb = debs[0]
	default:
		u := strings.TrimSuffix(mirror, "/") + "/" + strings.TrimSuffix(p.Filename, "_amd64.deb") + "_" + arch + ".deb"
		logf("apt does not list %s: fetching %s", spec, u)
		deb = filepath.Join(tmp, "download.deb")
		if err := download(ctx, u, deb); err != nil {
			return "", fmt.Errorf("%w\nand fetching %s: %v", aptErr, u, err)
		}
	}
	got, err := fileSHA256(deb)
	if err != nil {
		return "", err
	}
	if got != want {
		return "", fmt.Errorf("%s: the downloaded file's sha256 is %s, the pin %s", spec, got, want)
	}
	if err := os.Rename(deb, file); err != nil {
		return "", err
	}
	return file, nil
}

func download(ctx context.Context, url, dst string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", resp.Status)
	}
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// aptSHA256 is the SHA256 apt's package index lists for spec
// (name:arch=version).
func aptSHA256(ctx context.Context, spec string) (string, error) {
	if _, err := exec.LookPath("apt-cache"); err != nil {
		return "", fmt.Errorf("fetching %s needs apt (a Debian or Ubuntu build machine), or build with deployments/container/Dockerfile: %w", spec, err)
	}
	cmd := exec.CommandContext(ctx, "apt-cache", "show", "--no-all-versions", spec)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || len(out) == 0 {
		return "", fmt.Errorf("apt-cache show %s: %v %s\nthe package index lacks this version: run `apt-get update`; if the archive dropped it (a newer point or security release replaced it), pin the version and sha256 that `apt-cache show --no-all-versions %s` lists in %s",
			spec, err, strings.TrimSpace(stderr.String()), strings.SplitN(spec, "=", 2)[0], ManifestPath)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "SHA256: "); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("apt-cache show %s lists no SHA256", spec)
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// unpackDeb adds the files of a .deb's data archive to files, as
// `dpkg-deb --fsys-tarfile` lists them (directories, regular files,
// symbolic links; owners and modes kept). A regular file or link that
// another package already put at the same path is an error.
func unpackDeb(ctx context.Context, deb string, files map[string]file) error {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w\n%s", deb, err, stderr.Bytes())
	}
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", deb, err)
		}
		name := path.Clean("/" + h.Name)
		if name == "/" {
			continue
		}
		f := file{mode: h.Mode & 0o7777, uid: h.Uid, gid: h.Gid}
		switch h.Typeflag {
		case tar.TypeDir:
			f.dir = true
			if old, ok := files[name]; ok && old.dir {
				continue
			}
		case tar.TypeReg:
			if f.data, err = io.ReadAll(tr); err != nil {
				return fmt.Errorf("%s: %s: %w", deb, name, err)
			}
		case tar.TypeSymlink:
			f.link = h.Linkname
		case tar.TypeLink:
			target, ok := files[path.Clean("/"+h.Linkname)]
			if !ok || target.dir || target.link != "" {
				return fmt.Errorf("%s: hard link %s to %s, which is not a regular file before it", deb, name, h.Linkname)
			}
			f.data = target.data
		default:
			return fmt.Errorf("%s: %s has tar type %q, which the image builder does not handle", deb, name, h.Typeflag)
		}
		if _, ok := files[name]; ok {
			return fmt.Errorf("%s: %s is already in the image (two packages ship it)", deb, name)
		}
		files[name] = f
	}
}
