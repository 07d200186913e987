package localcluster

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/tessera-dev/tessera/test/helm"
	"github.com/tessera-dev/tessera/test/imagebuild"
)

// builtImage is Tessera's image, built once per cluster.
type builtImage struct {
	archive string
	digest  string
	// plugin is /usr/bin/kubelet-plugin extracted from the image: the very
	// binary the DaemonSet runs, used on the host for --print-slices.
	plugin string
}

// ensureImage builds Tessera's image (once per Cluster value), imports it
// into containerd's k8s.io namespace unless an image of the same digest is
// already there, and extracts the plugin binary for --print-slices.
func (c *Cluster) ensureImage(ctx context.Context) (*builtImage, error) {
	c.mu.Lock()
	img := c.image
	c.mu.Unlock()
	if img == nil {
		archive := filepath.Join(c.Dirs.Images, "tessera.tar")
		start := time.Now()
		c.logf("building image %s from %s (hack/image; no Docker)", helm.LocalClusterImage, imagebuild.ManifestPath)
		stop := progress(30*time.Second, func(elapsed time.Duration) {
			c.logf("  still building the image (%s; a cold Go build cache takes minutes)", elapsed.Round(time.Second))
		})
		res, err := imagebuild.Build(ctx, imagebuild.Options{
			RepoRoot: c.Opts.RepoRoot,
			Tag:      helm.LocalClusterImage,
			Output:   archive,
			Logf:     func(f string, a ...any) { c.logf("  image: "+f, a...) },
		})
		stop()
		if err != nil {
			return nil, fmt.Errorf("building the image: %w", err)
		}
		img = &builtImage{archive: archive, digest: res.Digest.String()}
		c.logf("built %s %s with %s (%s)", res.Tag, img.digest, strings.Join(res.Commands, ", "), time.Since(start).Round(100*time.Millisecond))
		if slices.Contains(res.Commands, "kubelet-plugin") {
			img.plugin = filepath.Join(c.Dirs.Bin, "tessera-kubelet-plugin-image")
			if err := extractFromImage(archive, strings.TrimPrefix(pluginExecutable, "/"), img.plugin); err != nil {
				return nil, fmt.Errorf("extracting %s from the image: %w", pluginExecutable, err)
			}
		}
		c.mu.Lock()
		c.image = img
		c.mu.Unlock()
	}
	if !c.running(compContainerd) {
		return img, nil // imported once containerd runs (Up)
	}
	if got, _ := c.imageDigest(ctx, helm.LocalClusterImage); got == img.digest {
		return img, nil
	}
	c.logf("importing %s into containerd (no registry involved)", helm.LocalClusterImage)
	if out, err := c.ctr(ctx, "-n", "k8s.io", "images", "import", "--snapshotter", "overlayfs", img.archive); err != nil {
		return nil, fmt.Errorf("importing %s: %w\n%s", img.archive, err, out)
	}
	if got, err := c.imageDigest(ctx, helm.LocalClusterImage); got != img.digest {
		return nil, fmt.Errorf("image %s in containerd has digest %q after import, want %s (err %v)", helm.LocalClusterImage, got, img.digest, err)
	}
	return img, nil
}

// extractFromImage copies one file of the (only) image in an OCI layout
// archive to dst, executable.
func extractFromImage(archive, name, dst string) error {
	dir, err := os.MkdirTemp("", "tessera-image-layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := untar(archive, dir); err != nil {
		return err
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	if len(m.Manifests) != 1 {
		return fmt.Errorf("%s holds %d manifests, want 1", archive, len(m.Manifests))
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		return err
	}
	fs := mutate.Extract(img)
	defer fs.Close()
	tr := tar.NewReader(fs)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return fmt.Errorf("no %s in the image", name)
		}
		if err != nil {
			return err
		}
		if strings.TrimPrefix(h.Name, "./") != name || h.Typeflag != tar.TypeReg {
			continue
		}
		tmp := dst + ".tmp"
		f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		return os.Rename(tmp, dst)
	}
}

// untar unpacks the regular files and directories of a tar archive.
func untar(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			out, err := os.Create(p)
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, tr); err != nil {
				out.Close()
				return err
			}
			if err := out.Close(); err != nil {
				return err
			}
		}
	}
}
