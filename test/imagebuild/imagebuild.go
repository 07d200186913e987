// Package imagebuild builds Tessera's container image from its one
// definition, deployments/container/image.yaml (see Manifest): it compiles
// the binaries, unpacks the pinned Debian packages that supply their
// runtime libraries (fetched with `apt-get download`, checksums verified;
// nothing is copied from the build machine's /lib), adds /etc/passwd,
// /etc/group and the listed directories, checks with Verify that every
// binary can start inside the image, and writes
//
//   - an OCI image layout archive that `ctr -n k8s.io images import`
//     (containerd) and `podman load` accept: what `make image-archive`,
//     the end-to-end tests and `make demo` use;
//   - and/or the image's file system as a directory: what the build stage of
//     deployments/container/Dockerfile writes and its FROM scratch stage
//     copies, so both builds hold the same files.
//
// NVIDIA's libraries are never in the image: the plugin loads them from the
// node's driver root.
package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
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

// BinDir is where the commands live in the image.
const BinDir = "/usr/bin"

// Epoch is the modification time of every file in the image and its
// creation time, so equal inputs give equal digests.
var Epoch = time.Unix(0, 0).UTC()

// Options configure Build.
type Options struct {
	// RepoRoot is the repository to build from; its ManifestPath defines
	// the image.
	RepoRoot string
	// Tag is the image name, e.g. tessera.dev/tessera:dev.
	Tag string
	// Output is the OCI archive to write (a tar of an OCI image layout);
	// empty: none.
	Output string
	// Rootfs is a directory to write the image's file system into (it must
	// not exist or be empty); empty: none.
	Rootfs string
	// Only names the binaries to include; nil: every binary of the
	// manifest, except a ./cmd/<name> that has no Go sources yet (left out
	// with a note).
	Only []string
	// Version is stamped into the image's labels.
	Version string
	// DebCache keeps the fetched .deb files; empty: DefaultDebCache().
	DebCache string
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

// Build compiles the binaries, assembles the image and writes it.
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
	if o.DebCache == "" {
		o.DebCache = DefaultDebCache()
	}
	if o.Output == "" && o.Rootfs == "" {
		return nil, fmt.Errorf("nothing to write: set an OCI archive (Output) or a directory (Rootfs)")
	}
	m, err := LoadManifest(o.RepoRoot)
	if err != nil {
		return nil, err
	}
	cmds, err := selectCommands(m, o)
	if err != nil {
		return nil, err
	}
	goarch := os.Getenv("GOARCH")
	if goarch == "" {
		goarch = runtime.GOARCH
	}
	tmp, err := os.MkdirTemp("", "tessera-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	files := Files{}
	res := &Result{Tag: o.Tag}
	for _, p := range m.Packages {
		deb, err := fetchDeb(ctx, p, DebianArch(goarch), m.Mirror, o.DebCache, o.Logf)
		if err != nil {
			return nil, err
		}
		o.Logf("unpacking %s %s", p.Name, p.Version)
		if err := unpackDeb(ctx, deb, files); err != nil {
			return nil, err
		}
	}
	for _, c := range cmds {
		bin := filepath.Join(tmp, c.Name)
		o.Logf("building %s (cgo %v)", c.Package, c.CGO)
		if err := goBuild(ctx, o.RepoRoot, bin, c.Package, c.CGO); err != nil {
			return nil, err
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			return nil, err
		}
		p := path.Join(BinDir, c.Name)
		if _, ok := files[p]; ok {
			return nil, fmt.Errorf("%s: binary %s: a Debian package already ships %s", ManifestPath, c.Name, p)
		}
		files.add(p, file{mode: 0o755, data: data})
		res.Commands = append(res.Commands, c.Name)
	}
	var passwd, group strings.Builder
	for _, u := range m.Users {
		fmt.Fprintf(&passwd, "%s:x:%d:%d:%s:%s:/sbin/nologin\n", u.Name, u.UID, u.UID, u.Name, u.Home)
		fmt.Fprintf(&group, "%s:x:%d:\n", u.Name, u.UID)
		files.add(u.Home, file{mode: 0o700, dir: true, uid: u.UID, gid: u.UID})
	}
	files.add("/etc/passwd", file{mode: 0o644, data: []byte(passwd.String())})
	files.add("/etc/group", file{mode: 0o644, data: []byte(group.String())})
	for _, d := range m.Directories {
		mode, _ := d.mode()
		files.add(d.Path, file{mode: mode, dir: true})
	}
	if err := Verify(files, goarch, res.Commands); err != nil {
		return nil, fmt.Errorf("the image would not run: %w", err)
	}
	for p := range files {
		res.Files = append(res.Files, p)
	}
	sort.Strings(res.Files)

	if o.Rootfs != "" {
		o.Logf("writing the file system to %s", o.Rootfs)
		if err := writeRootfs(o.Rootfs, files); err != nil {
			return nil, err
		}
	}
	layerTar, err := tarFiles(files)
	if err != nil {
		return nil, err
	}
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
	cfg.Architecture, cfg.OS = goarch, "linux"
	cfg.Created = v1.Time{Time: Epoch}
	// As deployments/container/Dockerfile's ENV and WORKDIR.
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
		cfg.History[i].CreatedBy = "tessera hack/image from " + ManifestPath
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, err
	}
	if res.Digest, err = img.Digest(); err != nil {
		return nil, err
	}
	if o.Output == "" {
		return res, nil
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
		layout.WithPlatform(v1.Platform{OS: "linux", Architecture: goarch}),
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

// selectCommands picks the manifest's binaries Options ask for.
func selectCommands(m *Manifest, o Options) ([]Command, error) {
	var cmds []Command
	if o.Only == nil {
		for _, c := range m.Binaries {
			if dir, ok := strings.CutPrefix(c.Package, "./"); ok && !HasGoSources(filepath.Join(o.RepoRoot, dir)) {
				o.Logf("%s has no sources yet: left out of the image", c.Package)
				continue
			}
			cmds = append(cmds, c)
		}
	}
	for _, name := range o.Only {
		i := slices.IndexFunc(m.Binaries, func(c Command) bool { return c.Name == name })
		if i < 0 {
			known := make([]string, 0, len(m.Binaries))
			for _, c := range m.Binaries {
				known = append(known, c.Name)
			}
			return nil, fmt.Errorf("binary %q is not in %s; known: %s", name, ManifestPath, strings.Join(known, ", "))
		}
		cmds = append(cmds, m.Binaries[i])
	}
	if len(cmds) == 0 {
		return nil, fmt.Errorf("no binary to put into the image")
	}
	return cmds, nil
}

// add puts f at p, with any missing parent directory (0755, root).
func (fs Files) add(p string, f file) {
	fs[p] = f
	for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
		if _, ok := fs[d]; !ok {
			fs[d] = file{mode: 0o755, dir: true}
		}
	}
}

// writeRootfs writes files under dir: modes kept, owners too when running
// as root (as in the Dockerfile's build stage).
func writeRootfs(dir string, files Files) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) > 0 {
		return fmt.Errorf("rootfs %s: want an empty or missing directory (%d entries, %v)", dir, len(ents), err)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	root := os.Geteuid() == 0
	for _, n := range names {
		f, p := files[n], filepath.Join(dir, filepath.FromSlash(n))
		var err error
		switch {
		case f.dir:
			err = os.Mkdir(p, 0o755)
		case f.link != "":
			err = os.Symlink(f.link, p)
		default:
			err = os.WriteFile(p, f.data, 0o600)
		}
		if err == nil && root {
			err = os.Lchown(p, f.uid, f.gid)
		}
		if err == nil && f.link == "" && !f.dir {
			err = os.Chmod(p, modeOf(f.mode))
		}
		if err != nil {
			return err
		}
	}
	// Directory modes last (and deepest first), so a read-only directory
	// does not stop its children being written.
	for i := len(names) - 1; i >= 0; i-- {
		if f := files[names[i]]; f.dir {
			if err := os.Chmod(filepath.Join(dir, filepath.FromSlash(names[i])), modeOf(f.mode)); err != nil {
				return err
			}
		}
	}
	return nil
}

// modeOf turns a tar mode (with setuid, setgid and sticky bits) into an
// os.FileMode.
func modeOf(m int64) os.FileMode {
	mode := os.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		mode |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		mode |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		mode |= os.ModeSticky
	}
	return mode
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

// tarFiles writes files as a layer: sorted, parents first, fixed times.
func tarFiles(files Files) ([]byte, error) {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		f := files[n]
		h := &tar.Header{Name: strings.TrimPrefix(n, "/"), Mode: f.mode, ModTime: Epoch, Uid: f.uid, Gid: f.gid, Format: tar.FormatPAX}
		switch {
		case f.dir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case f.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.link
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
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
