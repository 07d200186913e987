package localcluster

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"
)

// BusyboxImage is the only image the local cluster has. It is assembled from
// Debian's busybox-static (the static binary plus one symlink per applet),
// imported into containerd's k8s.io namespace without any registry, and also
// serves as the pinned sandbox ("pause") image. Its default command is
// `sleep infinity`. Pods must use it with imagePullPolicy Never or
// IfNotPresent: any other image name makes containerd try to pull from the
// internet, which the network rule forbids.
const BusyboxImage = "tessera.local/busybox:1.35.0"

// epoch is the fixed modification time of every file in built layers, so the
// same inputs always give the same digests.
var epoch = time.Unix(0, 0)

type layerEntry struct {
	name     string // path inside the image, without leading slash
	mode     int64
	data     []byte
	linkname string // symlink target when non-empty
	dir      bool
}

// busyboxLayer lists the files of the busybox image.
func busyboxLayer(busybox string) ([]layerEntry, error) {
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(busybox, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list-full: %w", busybox, err)
	}
	dirs := map[string]bool{"bin": true, "dev": true, "etc": true, "proc": true, "sys": true, "tmp": true, "root": true, "var": true, "usr": true}
	entries := []layerEntry{
		{name: "bin/busybox", mode: 0o755, data: bin},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnogroup:x:65534:\n")},
	}
	for _, applet := range strings.Fields(string(out)) {
		applet = strings.TrimPrefix(applet, "/")
		if applet == "bin/busybox" {
			continue
		}
		for d := path.Dir(applet); d != "." && d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
		entries = append(entries, layerEntry{name: applet, mode: 0o777, linkname: "/bin/busybox"})
	}
	for d := range dirs {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		entries = append(entries, layerEntry{name: d, mode: mode, dir: true})
	}
	// Parents sort before their children.
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	return entries, nil
}

func layerTar(entries []layerEntry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case e.dir:
			h.Typeflag, h.Name = tar.TypeDir, e.name+"/"
		case e.linkname != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.linkname
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(e.data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// ociImageTar assembles an OCI image layout (oci-layout, index.json, blobs)
// holding one single-layer image, as a tar stream ready for
// `ctr images import`.
func ociImageTar(name string, layer []byte, cmd []string) ([]byte, error) {
	layerDigest := digestOf(layer)
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      epoch.UTC().Format(time.RFC3339),
		"config": map[string]any{
			"Env":        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"Cmd":        cmd,
			"WorkingDir": "/",
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
		"history": []map[string]any{{"created": epoch.UTC().Format(time.RFC3339), "created_by": "tessera localcluster"}},
	})
	if err != nil {
		return nil, err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digestOf(config), "size": len(config)},
		"layers":        []map[string]any{{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layerDigest, "size": len(layer)}},
	})
	if err != nil {
		return nil, err
	}
	tag := name[strings.LastIndex(name, ":")+1:]
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []map[string]any{{
			"mediaType": "application/vnd.oci.image.manifest.v1+json",
			"digest":    digestOf(manifest),
			"size":      len(manifest),
			"platform":  map[string]string{"architecture": runtime.GOARCH, "os": "linux"},
			"annotations": map[string]string{
				"io.containerd.image.name":          name,
				"org.opencontainers.image.ref.name": tag,
			},
		}},
	})
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return nil, err
	}
	if err := add("index.json", index); err != nil {
		return nil, err
	}
	if err := tw.WriteHeader(&tar.Header{Name: "blobs/", Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir}); err != nil {
		return nil, err
	}
	if err := tw.WriteHeader(&tar.Header{Name: "blobs/sha256/", Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir}); err != nil {
		return nil, err
	}
	for _, blob := range [][]byte{layer, config, manifest} {
		if err := add("blobs/sha256/"+strings.TrimPrefix(digestOf(blob), "sha256:"), blob); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeBusyboxImage writes the busybox image as an OCI layout tar to dst.
func writeBusyboxImage(busybox, dst string) error {
	entries, err := busyboxLayer(busybox)
	if err != nil {
		return err
	}
	layer, err := layerTar(entries)
	if err != nil {
		return err
	}
	img, err := ociImageTar(BusyboxImage, layer, []string{"sleep", "infinity"})
	if err != nil {
		return err
	}
	return os.WriteFile(dst, img, 0o644)
}

// ctr runs containerd's ctr against this cluster's containerd.
func (c *Cluster) ctr(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Bin.Ctr, append([]string{"--address", c.Dirs.ContainerdSocket}, args...)...)
	cmd.Env = []string{c.hostPath()}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// ImagePresent tells whether containerd has image ref in the k8s.io
// namespace (where the kubelet looks), without pulling anything.
func (c *Cluster) ImagePresent(ctx context.Context, ref string) (bool, error) {
	d, err := c.imageDigest(ctx, ref)
	return d != "", err
}

// imageDigest is the manifest digest containerd lists for ref ("" if none).
func (c *Cluster) imageDigest(ctx context.Context, ref string) (string, error) {
	out, err := c.ctr(ctx, "-n", "k8s.io", "images", "ls")
	if err != nil {
		return "", fmt.Errorf("ctr images ls: %w: %s", err, out)
	}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == ref {
			return f[2], nil
		}
	}
	return "", nil
}
