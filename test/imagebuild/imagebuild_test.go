package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("repository root not at %s: %v", dir, err)
	}
	return dir
}

// untar extracts an archive into a new temp dir.
func untar(t *testing.T, archive string) string {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	extract(t, f, dir)
	return dir
}

func extract(t *testing.T, r io.Reader, dir string) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, dir) {
			t.Fatalf("entry %q escapes the archive", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, data, os.FileMode(h.Mode)&0o777); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("unexpected entry %q type %c", h.Name, h.Typeflag)
		}
	}
}

// TestBuildReadBack builds the image and reads it back as containerd would:
// an OCI layout whose index names the image, one linux image with the
// binaries and what they need to start.
func TestBuildReadBack(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the commands")
	}
	root := repoRoot(t)
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
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.MediaType != types.OCIConfigJSON || len(m.Layers) != 1 || m.Layers[0].MediaType != types.OCILayer {
		t.Errorf("manifest = %+v", m)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture == "" || len(cfg.RootFS.DiffIDs) != 1 || cfg.Config.Labels["org.opencontainers.image.source"] == "" {
		t.Errorf("config = %+v", cfg)
	}
	// Layer digests verify (go-containerregistry checks while reading).
	rootfs := t.TempDir()
	rc := mutate.Extract(img)
	extract(t, rc, rootfs)
	rc.Close()

	for _, c := range res.Commands {
		bin := filepath.Join(rootfs, "usr/bin", c)
		fi, err := os.Stat(bin)
		if err != nil {
			t.Fatalf("image lacks /usr/bin/%s", c)
		}
		if fi.Mode()&0o111 == 0 {
			t.Errorf("/usr/bin/%s is not executable", c)
		}
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatalf("/usr/bin/%s is not an ELF binary: %v", c, err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				b, _ := io.ReadAll(p.Open())
				interp := strings.TrimRight(string(b), "\x00")
				if _, err := os.Stat(filepath.Join(rootfs, interp)); err != nil {
					t.Errorf("/usr/bin/%s needs %s, which the image lacks", c, interp)
				}
			}
		}
		libs, _ := f.ImportedLibraries()
		for _, l := range libs {
			found := false
			for _, d := range libraryDirs() {
				if _, err := os.Stat(filepath.Join(rootfs, d, l)); err == nil {
					found = true
				}
			}
			if !found {
				t.Errorf("/usr/bin/%s needs %s, which the image lacks", c, l)
			}
		}
		f.Close()
	}
	want := map[string]bool{"kubelet-plugin": true, "nvidia-cdi-hook": true}
	for _, c := range res.Commands {
		delete(want, c)
	}
	if len(want) != 0 {
		t.Errorf("image lacks %v", want)
	}
	passwd, _ := os.ReadFile(filepath.Join(rootfs, "etc/passwd"))
	if !bytes.Contains(passwd, []byte(":65532:65532:")) {
		t.Errorf("/etc/passwd has no nonroot user 65532: %q", passwd)
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "tmp")); err != nil || !fi.IsDir() {
		t.Error("image lacks /tmp")
	}

	// Same inputs, same image.
	out2 := filepath.Join(t.TempDir(), "again.tar")
	res2, err := Build(ctx, Options{RepoRoot: root, Output: out2})
	if err != nil {
		t.Fatal(err)
	}
	if res2.Digest != res.Digest {
		t.Errorf("rebuilding gave %s, first build %s: the image is not reproducible", res2.Digest, res.Digest)
	}

	// The plugin starts inside the image's filesystem: its loader and glibc
	// are there. Needs root for chroot.
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

// TestStaticBinaryNeedsNothing: a CGO_ENABLED=0 binary brings no libraries.
func TestStaticBinaryNeedsNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module x\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\nfunc main() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "x")
	if err := goBuild(context.Background(), dir, bin, ".", false); err != nil {
		t.Fatal(err)
	}
	libs, err := runtimeLibraries(bin)
	if err != nil || len(libs) != 0 {
		t.Errorf("static binary needs %v (%v)", libs, err)
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
