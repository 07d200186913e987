// Package imagebuild builds Tessera's container image without Docker: it
// compiles the commands, lays them out with what they need at run time and
// writes an OCI image layout archive that `ctr -n k8s.io images import`
// (containerd) and `podman load` accept.
//
// The image is the same as deployments/container/Dockerfile's:
//
//	/usr/bin/kubelet-plugin   cgo (go-nvml dlopens libnvidia-ml.so.1), so
//	                          dynamically linked against glibc; the loader
//	                          and the glibc libraries come along
//	/usr/bin/controller       static (CGO_ENABLED=0)
//	/usr/bin/nvidia-cdi-hook  cgo (go-nvml); NVIDIA's CDI hook, which the
//	                          plugin copies onto the host (it runs there,
//	                          against the host's glibc)
//	/etc/passwd, /etc/group   root and nonroot (65532)
//	/tmp
//
// glibc is copied from the build machine, as a distroless base image would
// provide it; NVIDIA's libraries are never in the image (the plugin loads
// them from the node's driver root).
package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// DefaultTag is the image name the local cluster's chart values deploy.
const DefaultTag = "tessera.dev/tessera:dev"

// Commands are the binaries that go into the image, with whether they need
// cgo.
var Commands = []Command{
	{Name: "kubelet-plugin", CGO: true},
	{Name: "controller", CGO: false},
	// The CDI hook the driver files' specs name (symlinks, ld cache); the
	// plugin copies it onto the host. Built from the Go module proxy at
	// the version go.mod's tool directive pins. cgo: it links go-nvml.
	{Name: "nvidia-cdi-hook", Package: "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook", CGO: true},
}

// Command is one binary: ./cmd/<Name>, or Package when set.
type Command struct {
	Name string
	// Package is a Go package of a dependency to build instead of
	// ./cmd/<Name>.
	Package string
	// CGO: the command needs cgo (go-nvml's dlopen wrapper does).
	CGO bool
}

func (c Command) pkg() string {
	if c.Package != "" {
		return c.Package
	}
	return "./cmd/" + c.Name
}

// BinDir is where the commands live in the image.
const BinDir = "/usr/bin"

// Epoch is the modification time of every file in the image and its
// creation time, so equal inputs give equal digests.
var Epoch = time.Unix(0, 0).UTC()

// Options configure Build.
type Options struct {
	// RepoRoot is the repository to build from.
	RepoRoot string
	// Tag is the image name, e.g. tessera.dev/tessera:dev.
	Tag string
	// Output is the OCI archive to write (a tar of an OCI image layout).
	Output string
	// Commands to include; nil: every entry of Commands whose ./cmd/<name>
	// has Go sources (a command not written yet is left out with a note).
	Commands []Command
	// Version is stamped into the image's labels.
	Version string
	// Logf reports progress; may be nil.
	Logf func(format string, args ...any)
}

// Result describes a built image.
type Result struct {
	Tag      string
	Digest   v1.Hash // manifest digest
	Commands []string
	// Files are the image's paths, sorted.
	Files []string
}

// Build compiles the commands and writes the OCI archive.
func Build(ctx context.Context, o Options) (*Result, error) {
	if o.Tag == "" {
		o.Tag = DefaultTag
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	cmds := o.Commands
	if cmds == nil {
		for _, c := range Commands {
			if c.Package != "" || HasGoSources(filepath.Join(o.RepoRoot, "cmd", c.Name)) {
				cmds = append(cmds, c)
			} else {
				o.Logf("./cmd/%s has no sources yet: left out of the image", c.Name)
			}
		}
	}
	if len(cmds) == 0 {
		return nil, fmt.Errorf("no command to put into the image")
	}
	tmp, err := os.MkdirTemp("", "tessera-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	files := map[string]file{}
	addDirs := func(p string) {
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			if _, ok := files[d]; !ok {
				files[d] = file{mode: 0o755, dir: true}
			}
		}
	}
	res := &Result{Tag: o.Tag}
	for _, c := range cmds {
		bin := filepath.Join(tmp, c.Name)
		o.Logf("building %s (cgo %v)", c.pkg(), c.CGO)
		if err := goBuild(ctx, o.RepoRoot, bin, c.pkg(), c.CGO); err != nil {
			return nil, err
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			return nil, err
		}
		p := path.Join(BinDir, c.Name)
		files[p] = file{mode: 0o755, data: data}
		addDirs(p)
		res.Commands = append(res.Commands, c.Name)
		libs, err := runtimeLibraries(bin)
		if err != nil {
			return nil, fmt.Errorf("./cmd/%s: %w", c.Name, err)
		}
		for _, lib := range libs {
			if _, ok := files[lib.imagePath]; ok {
				continue
			}
			data, err := os.ReadFile(lib.hostPath)
			if err != nil {
				return nil, err
			}
			files[lib.imagePath] = file{mode: 0o755, data: data}
			addDirs(lib.imagePath)
		}
	}
	files["/etc/passwd"] = file{mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")}
	files["/etc/group"] = file{mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")}
	files["/etc"] = file{mode: 0o755, dir: true}
	files["/tmp"] = file{mode: 0o1777, dir: true}
	files["/root"] = file{mode: 0o700, dir: true}
	files["/home/nonroot"] = file{mode: 0o700, dir: true, uid: 65532}
	addDirs("/home/nonroot/x")

	layerTar, err := tarFiles(files)
	if err != nil {
		return nil, err
	}
	for p := range files {
		res.Files = append(res.Files, p)
	}
	sort.Strings(res.Files)

	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(mutate.ConfigMediaType(empty.Image, types.OCIConfigJSON), types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = runtime.GOARCH, "linux"
	cfg.Created = v1.Time{Time: Epoch}
	cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cfg.Config.WorkingDir = "/"
	// No entrypoint: the chart names the command (/usr/bin/kubelet-plugin or
	// /usr/bin/controller), as for deployments/container/Dockerfile.
	cfg.Config.Labels = map[string]string{
		"org.opencontainers.image.title":       "tessera",
		"org.opencontainers.image.description": "Tessera DRA driver for shareable GPUs: kubelet plugin and controller",
		"org.opencontainers.image.source":      "https://github.com/tessera-dev/tessera",
		"org.opencontainers.image.version":     o.Version,
	}
	for i := range cfg.History {
		cfg.History[i].Created = v1.Time{Time: Epoch}
		cfg.History[i].CreatedBy = "tessera hack/image"
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, err
	}
	if res.Digest, err = img.Digest(); err != nil {
		return nil, err
	}

	dir := filepath.Join(tmp, "layout")
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return nil, err
	}
	tagPart := o.Tag[strings.LastIndex(o.Tag, ":")+1:]
	if !strings.Contains(o.Tag[strings.LastIndex(o.Tag, "/")+1:], ":") {
		tagPart = "latest"
	}
	if err := lp.AppendImage(img,
		layout.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
		layout.WithAnnotations(map[string]string{
			// containerd names the imported image after this annotation.
			"io.containerd.image.name":          o.Tag,
			"org.opencontainers.image.ref.name": tagPart,
		})); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(o.Output), 0o755); err != nil {
		return nil, err
	}
	if err := tarDir(dir, o.Output); err != nil {
		return nil, err
	}
	return res, nil
}

// HasGoSources tells whether dir holds a non-test Go file (a command that
// is not written yet has none).
func HasGoSources(dir string) bool {
	m, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, f := range m {
		if !strings.HasSuffix(f, "_test.go") {
			return true
		}
	}
	return false
}

func goBuild(ctx context.Context, root, out, pkg string, cgo bool) error {
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	cmd := exec.CommandContext(ctx, goBin, "build", "-trimpath", "-ldflags", "-s -w", "-o", out, pkg)
	cmd.Dir = root
	env := append(os.Environ(), "GOOS=linux", "GOFLAGS=-buildvcs=false")
	if cgo {
		env = append(env, "CGO_ENABLED=1")
		if os.Getenv("CGO_CFLAGS") == "" {
			// go-nvml declares every deprecated NVML call.
			env = append(env, "CGO_CFLAGS=-O2 -Wno-deprecated-declarations")
		}
	} else {
		env = append(env, "CGO_ENABLED=0")
	}
	cmd.Env = env
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

type library struct{ imagePath, hostPath string }

// glibcCompanions are loaded by glibc or by libraries the plugin dlopens
// (libnvidia-ml.so.1 needs libm, libdl, libpthread and librt). They must come
// from the same glibc as libc.so.6, so they come along whenever libc does.
var glibcCompanions = []string{"libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"}

// runtimeLibraries lists what a dynamically linked binary needs to start:
// its ELF interpreter and the transitive closure of DT_NEEDED, resolved on
// this machine. A static binary needs nothing.
func runtimeLibraries(bin string) ([]library, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var interp string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return nil, err
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	if interp == "" {
		return nil, nil
	}
	out := []library{{imagePath: interp, hostPath: interp}}
	if _, err := os.Stat(interp); err != nil {
		return nil, fmt.Errorf("ELF interpreter %s: %w", interp, err)
	}
	seen := map[string]bool{}
	queue, err := f.ImportedLibraries()
	if err != nil {
		return nil, err
	}
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		if seen[name] {
			continue
		}
		seen[name] = true
		if name == "libc.so.6" {
			queue = append(queue, glibcCompanions...)
		}
		p, err := findLibrary(name)
		if err != nil {
			return nil, err
		}
		out = append(out, library{imagePath: p, hostPath: p})
		lf, err := elf.Open(p)
		if err != nil {
			return nil, err
		}
		deps, err := lf.ImportedLibraries()
		lf.Close()
		if err != nil {
			return nil, err
		}
		queue = append(queue, deps...)
	}
	return out, nil
}

func libraryDirs() []string {
	triplet := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[runtime.GOARCH]
	return []string{"/lib/" + triplet, "/usr/lib/" + triplet, "/lib64", "/usr/lib64", "/lib", "/usr/lib"}
}

func findLibrary(name string) (string, error) {
	for _, d := range libraryDirs() {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("shared library %s not found in %v", name, libraryDirs())
}

type file struct {
	mode int64
	data []byte
	dir  bool
	uid  int
}

// tarFiles writes files as a layer: sorted, parents first, fixed times.
func tarFiles(files map[string]file) ([]byte, error) {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		f := files[n]
		h := &tar.Header{Name: strings.TrimPrefix(n, "/"), Mode: f.mode, ModTime: Epoch, Uid: f.uid, Gid: f.uid, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if !f.dir {
			if _, err := tw.Write(f.data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarDir archives an OCI layout directory (regular files and directories).
func tarDir(dir, out string) error {
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	err = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: Epoch, Format: tar.FormatPAX}
		if fi.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
			return tw.WriteHeader(h)
		}
		h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, fi.Size()
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err != nil {
		f.Close()
		return err
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}
