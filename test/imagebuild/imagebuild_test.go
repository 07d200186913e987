package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/tessera-dev/tessera/test/testutil"
)

// untar extracts an archive into a new temp dir.
func untar(t *testing.T, archive string) string {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return dir
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err == nil {
				err = os.WriteFile(p, data, 0o644)
			}
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("OCI layout entry %q has type %c", h.Name, h.Typeflag)
		}
	}
}

// readRootfs reads a directory written by Build's Rootfs back as Files
// (without following links).
func readRootfs(t *testing.T, dir string) Files {
	t.Helper()
	fs := Files{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		f := file{mode: int64(fi.Mode().Perm())}
		if fi.Mode()&os.ModeSticky != 0 {
			f.mode |= 0o1000
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && os.Geteuid() == 0 {
			f.uid, f.gid = int(st.Uid), int(st.Gid)
		}
		switch {
		case fi.IsDir():
			f.dir = true
		case fi.Mode()&os.ModeSymlink != 0:
			f.mode = 0o777
			if f.link, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			if f.data, err = os.ReadFile(p); err != nil {
				return err
			}
		}
		fs["/"+filepath.ToSlash(rel)] = f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// debFiles unpacks the manifest's packages (from the cache Build filled).
func debFiles(t *testing.T, m *Manifest) Files {
	t.Helper()
	fs := Files{}
	for _, p := range m.Packages {
		deb, err := fetchDeb(context.Background(), p, DebianArch(runtime.GOARCH), m.Mirror, DefaultDebCache(), t.Logf)
		if err != nil {
			t.Fatal(err)
		}
		if err := unpackDeb(context.Background(), deb, fs); err != nil {
			t.Fatal(err)
		}
	}
	return fs
}

// TestBuildReadBack builds the image and reads it back as containerd would:
// an OCI layout whose index names the image, one linux image with the
// binaries and what they need to start.
func TestBuildReadBack(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the commands")
	}
	root := testutil.Root(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out := filepath.Join(t.TempDir(), "image.tar")
	res, err := Build(ctx, Options{RepoRoot: root, Output: out, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if res.Tag != DefaultTag {
		t.Errorf("tag = %s", res.Tag)
	}

	dir := untar(t, out)
	for _, f := range []string{"oci-layout", "index.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("archive lacks %s", f)
		}
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if desc.Annotations["io.containerd.image.name"] != DefaultTag || desc.Annotations["org.opencontainers.image.ref.name"] != "dev" {
		t.Errorf("index annotations = %v: containerd would not name the image %s", desc.Annotations, DefaultTag)
	}
	if desc.Platform == nil || desc.Platform.OS != "linux" {
		t.Errorf("platform = %+v", desc.Platform)
	}
	if desc.Digest != res.Digest {
		t.Errorf("index points at %s, Build reported %s", desc.Digest, res.Digest)
	}
	img, err := lp.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s", mt)
	}
	om, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if om.Config.MediaType != types.OCIConfigJSON || len(om.Layers) != 1 || om.Layers[0].MediaType != types.OCILayer {
		t.Errorf("manifest = %+v", om)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture == "" || len(cfg.RootFS.DiffIDs) != 1 || cfg.Config.Labels["org.opencontainers.image.source"] == "" {
		t.Errorf("config = %+v", cfg)
	}
	// Layer digests verify (go-containerregistry checks while reading).
	rc := mutate.Extract(img)
	files, err := ReadLayer(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}

	m, err := LoadManifest(root)
	if err != nil {
		t.Fatal(err)
	}
	var bins []string
	for _, c := range m.Binaries {
		bins = append(bins, c.Name)
	}
	if !slices.Equal(res.Commands, bins) {
		t.Errorf("image has binaries %v, %s lists %v", res.Commands, ManifestPath, bins)
	}
	// Every binary present and executable, its interpreter and every
	// DT_NEEDED library (transitively) in the image, symbol versions met.
	if err := Verify(files, runtime.GOARCH, bins); err != nil {
		t.Error(err)
	}
	// The plugin is dynamically linked (cgo), so the check above was not
	// vacuous.
	if f, err := elf.NewFile(bytes.NewReader(files["/usr/bin/kubelet-plugin"].data)); err != nil {
		t.Error(err)
	} else if libs, _ := f.ImportedLibraries(); !slices.Contains(libs, "libc.so.6") {
		t.Errorf("kubelet-plugin needs %v, want libc.so.6 among them (cgo)", libs)
	}

	// Provenance: every path is a built binary, a generated file or
	// directory, or exactly what a pinned Debian package ships. Nothing
	// comes from this machine's /lib.
	debs := debFiles(t, m)
	generated := map[string]bool{"/etc/passwd": true, "/etc/group": true}
	for _, u := range m.Users {
		generated[u.Home] = true
	}
	for _, d := range m.Directories {
		generated[d.Path] = true
	}
	for p, f := range files {
		if d, ok := debs[p]; ok {
			if !bytes.Equal(d.data, f.data) || d.link != f.link || d.mode != f.mode || d.dir != f.dir {
				t.Errorf("%s differs from what the Debian package ships", p)
			}
			continue
		}
		if generated[p] || (f.dir && f.mode == 0o755) {
			continue
		}
		if dir, name := path.Split(p); dir == BinDir+"/" && slices.Contains(bins, name) {
			continue
		}
		t.Errorf("%s is in the image but neither a binary, a generated file nor from a pinned package", p)
	}
	for p := range debs {
		if _, ok := files[p]; !ok {
			t.Errorf("%s (from a pinned package) is not in the image", p)
		}
	}
	if !bytes.Contains(files["/etc/passwd"].data, []byte("nonroot:x:65532:65532:")) {
		t.Errorf("/etc/passwd has no nonroot user 65532: %q", files["/etc/passwd"].data)
	}
	if f := files["/tmp"]; !f.dir || f.mode != 0o1777 {
		t.Errorf("/tmp = %+v, want a directory with mode 1777", f)
	}

	// Same inputs, same image; the Dockerfile's build stage writes the same
	// files as a directory (-rootfs), which its FROM scratch stage copies.
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	res2, err := Build(ctx, Options{RepoRoot: root, Rootfs: rootfs})
	if err != nil {
		t.Fatal(err)
	}
	if res2.Digest != res.Digest {
		t.Errorf("rebuilding gave %s, first build %s: the image is not reproducible", res2.Digest, res.Digest)
	}
	onDisk := readRootfs(t, rootfs)
	if len(onDisk) != len(files) {
		t.Errorf("rootfs has %d entries, the image layer %d", len(onDisk), len(files))
	}
	for p, f := range files {
		d, ok := onDisk[p]
		if !ok {
			t.Errorf("rootfs lacks %s", p)
			continue
		}
		if f.link != "" {
			f.mode = 0o777
		}
		if os.Geteuid() != 0 {
			f.uid, f.gid = 0, 0
		}
		if !bytes.Equal(d.data, f.data) || d.link != f.link || d.mode != f.mode || d.dir != f.dir || d.uid != f.uid || d.gid != f.gid {
			t.Errorf("rootfs %s = mode %o link %q uid %d, layer: mode %o link %q uid %d", p, d.mode, d.link, d.uid, f.mode, f.link, f.uid)
		}
	}

	// The plugin starts inside the image's file system, on the Debian
	// packages' loader and glibc. Needs root for chroot.
	if os.Geteuid() != 0 {
		t.Log("not root: skipping the chroot run of the plugin")
		return
	}
	chroot, err := exec.LookPath("chroot")
	if err != nil {
		t.Log("no chroot binary: skipping the chroot run of the plugin")
		return
	}
	cmd := exec.CommandContext(ctx, chroot, rootfs, "/usr/bin/kubelet-plugin",
		"--gpu-backend=mock", "--mock-profile=t4:1", "--node-name=image-test", "--print-slices")
	cmd.Env = []string{"PATH=/usr/bin"}
	b, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(b, []byte("kind: ResourceSlice")) {
		t.Errorf("kubelet-plugin --print-slices in the image: %v\n%s", err, b)
	}
}

// buildTiny builds a one-line Go program, with or without cgo.
func buildTiny(t *testing.T, cgo bool) []byte {
	t.Helper()
	dir := t.TempDir()
	src := "package main\n\nfunc main() {}\n"
	if cgo {
		src = "package main\n\n// #include <stdlib.h>\nimport \"C\"\n\nfunc main() { C.free(nil) }\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module x\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "x")
	if err := goBuild(context.Background(), dir, bin, ".", cgo); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestVerify: Verify accepts an image whose binaries can start and names
// what is missing otherwise.
func TestVerify(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and fetches the pinned Debian packages")
	}
	m, err := LoadManifest(testutil.Root(t))
	if err != nil {
		t.Fatal(err)
	}
	debs := debFiles(t, m)
	dynamic, static := buildTiny(t, true), buildTiny(t, false)
	triplet := strings.TrimPrefix(libraryDirs(runtime.GOARCH)[0], "/lib/")
	libc := path.Join("/lib", triplet, "libc.so.6")
	for _, tc := range []struct {
		name string
		edit func(Files)
		want string // "" for no error
	}{
		{"complete", func(Files) {}, ""},
		{"static binary, no libraries", func(fs Files) {
			for p := range fs {
				delete(fs, p)
			}
			fs.add("/usr/bin/x", file{mode: 0o755, data: static})
		}, ""},
		{"no libc", func(fs Files) { delete(fs, libc) }, "needs libc.so.6"},
		{"no libm for libnvidia-ml", func(fs Files) { delete(fs, path.Join("/lib", triplet, "libm.so.6")) }, "needs libm.so.6"},
		{"no loader", func(fs Files) { delete(fs, path.Join("/lib", triplet, path.Base(interpOf(t, dynamic)))) }, "ELF interpreter"},
		{"not executable", func(fs Files) { f := fs["/usr/bin/x"]; f.mode = 0o644; fs["/usr/bin/x"] = f }, "not an executable"},
		{"older glibc than the binary's", func(fs Files) {
			f := fs[libc]
			f.data = bytes.ReplaceAll(f.data, []byte("GLIBC_2.34\x00"), []byte("GLIBC_X.34\x00"))
			fs[libc] = f
		}, "needs GLIBC_2.34 from libc.so.6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := Files{}
			for p, f := range debs {
				fs[p] = f
			}
			fs.add("/usr/bin/x", file{mode: 0o755, data: dynamic})
			tc.edit(fs)
			err := Verify(fs, runtime.GOARCH, []string{"x"})
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Verify: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Verify = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func interpOf(t *testing.T, bin []byte) string {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, _ := io.ReadAll(p.Open())
			return strings.TrimRight(string(b), "\x00")
		}
	}
	t.Fatal("no PT_INTERP")
	return ""
}

// TestParseManifest: the committed manifest parses; bad input names the
// field.
func TestParseManifest(t *testing.T) {
	good, err := os.ReadFile(filepath.Join(testutil.Root(t), ManifestPath))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseManifest(good); err != nil {
		t.Fatalf("%s: %v", ManifestPath, err)
	}
	base := "debian: bookworm\nmirror: http://deb.debian.org/debian\nbinaries: [{name: a, package: ./cmd/a}]\n"
	pkg := "packages: [{name: libc6, version: '1', filename: pool/main/g/glibc/libc6_1_amd64.deb, "
	for _, tc := range []struct{ name, yaml, want string }{
		{"minimal", base, ""},
		{"no release", "mirror: http://x\nbinaries: [{name: a, package: ./cmd/a}]\n", "debian:"},
		{"no mirror", "debian: bookworm\nbinaries: [{name: a, package: ./cmd/a}]\n", "mirror:"},
		{"no binaries", "debian: bookworm\nmirror: http://x\n", "binaries:"},
		{"binary without package", "debian: bookworm\nmirror: http://x\nbinaries: [{name: a}]\n", "binaries[0].package"},
		{"duplicate binary", "debian: bookworm\nmirror: http://x\nbinaries: [{name: a, package: x}, {name: a, package: y}]\n", "binaries[1].name"},
		{"unknown field", base + "pakages: []\n", "pakages"},
		{"package", base + pkg + "sha256: {amd64: " + strings.Repeat("a", 64) + "}}]\n", ""},
		{"package without version", base + "packages: [{name: libc6, sha256: {amd64: " + strings.Repeat("a", 64) + "}}]\n", "packages[0].version"},
		{"package without filename", base + "packages: [{name: libc6, version: '1', sha256: {amd64: " + strings.Repeat("a", 64) + "}}]\n", "packages[0].filename"},
		{"package without sha256", base + pkg + "}]\n", "packages[0].sha256"},
		{"bad sha256", base + pkg + "sha256: {amd64: ABC}}]\n", "packages[0].sha256.amd64"},
		{"relative home", base + "users: [{name: u, uid: 1, home: home}]\n", "users[0]"},
		{"bad mode", base + "directories: [{path: /tmp, mode: '1999'}]\n", "directories[0].mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseManifest([]byte(tc.yaml))
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("ParseManifest: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("ParseManifest = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestDockerfileUsesTheManifest: deployments/container/Dockerfile builds
// its file system with this package (hack/image -rootfs) and copies it onto
// an empty image, on the Debian release the manifest pins.
func TestDockerfileUsesTheManifest(t *testing.T) {
	root := testutil.Root(t)
	m, err := LoadManifest(root)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "deployments/container/Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	for _, want := range []string{
		"ARG DEBIAN=" + m.Debian + "\n",
		"go run ./hack/image -o '' -rootfs /rootfs",
		"FROM scratch\n",
		"COPY --from=build /rootfs /\n",
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	if strings.Count(df, "\nFROM ") != 2 {
		t.Errorf("Dockerfile has %d stages, want the build stage and FROM scratch", strings.Count(df, "\nFROM "))
	}
}

// TestLayerIsDeterministic checks the layer tar: sorted, parents first,
// fixed times and owners.
func TestLayerIsDeterministic(t *testing.T) {
	files := map[string]file{
		"/usr/bin/a": {mode: 0o755, data: []byte("a")},
		"/usr":       {mode: 0o755, dir: true},
		"/usr/bin":   {mode: 0o755, dir: true},
		"/tmp":       {mode: 0o1777, dir: true},
	}
	a, err := tarFiles(files)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := tarFiles(files)
	if !bytes.Equal(a, b) {
		t.Fatal("same files, different layers")
	}
	tr := tar.NewReader(bytes.NewReader(a))
	var names []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(Epoch) {
			t.Errorf("%s: mtime %v", h.Name, h.ModTime)
		}
		names = append(names, h.Name)
	}
	if got := strings.Join(names, ","); got != "tmp/,usr/,usr/bin/,usr/bin/a" {
		t.Errorf("order = %s", got)
	}
}

// TestFetchDebFromMirror: a version apt does not list (here a package no
// archive has) comes from mirror/filename and must match the pinned
// SHA256; the cache then answers without the network.
func TestFetchDebFromMirror(t *testing.T) {
	body := []byte("not really a deb")
	sum := sha256.Sum256(body)
	good := hex.EncodeToString(sum[:])
	var hits int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		if r.URL.Path != "/debian/pool/main/t/tessera-no-such-package/tessera-no-such-package_1_amd64.deb" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	pkg := func(sha, filename string) Package {
		return Package{Name: "tessera-no-such-package", Version: "1", Filename: filename, SHA256: map[string]string{"amd64": sha}}
	}
	const filename = "pool/main/t/tessera-no-such-package/tessera-no-such-package_1_amd64.deb"
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		p    Package
		want string // "" for success
	}{
		{"pinned sha256 matches", pkg(good, filename), ""},
		{"pinned sha256 differs", pkg(strings.Repeat("0", 64), filename), "the pin " + strings.Repeat("0", 64)},
		{"not on the mirror", pkg(good, "pool/main/t/other/other_1_amd64.deb"), "404"},
		{"architecture not pinned", Package{Name: "x", Version: "1", Filename: filename, SHA256: map[string]string{"arm64": good}}, "no sha256 for architecture amd64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache := t.TempDir()
			got, err := fetchDeb(ctx, tc.p, "amd64", srv.URL+"/debian", cache, t.Logf)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("fetchDeb = %v, want an error containing %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(got); !bytes.Equal(b, body) {
				t.Errorf("cached file holds %q", b)
			}
			before := hits
			if again, err := fetchDeb(ctx, tc.p, "amd64", "http://127.0.0.1:1/unreachable", cache, t.Logf); err != nil || again != got || hits != before {
				t.Errorf("second fetch = %s, %v (%d more requests): want the cached file", again, err, hits-before)
			}
		})
	}
}
