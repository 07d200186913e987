package localcluster

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
)

// readTar returns the regular files and symlinks of a tar stream.
func readTar(t *testing.T, b []byte) (files map[string][]byte, links map[string]string) {
	t.Helper()
	files, links = map[string][]byte{}, map[string]string{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeReg:
			data, _ := io.ReadAll(tr)
			files[h.Name] = data
		case tar.TypeSymlink:
			links[h.Name] = h.Linkname
		}
	}
}

func TestBusyboxImageIsAValidReproducibleOCILayout(t *testing.T) {
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("Debian's busybox-static is not installed")
	}
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	for _, p := range []string{a, b} {
		if err := writeBusyboxImage("/bin/busybox", p); err != nil {
			t.Fatal(err)
		}
	}
	imgA, _ := os.ReadFile(a)
	imgB, _ := os.ReadFile(b)
	if !bytes.Equal(imgA, imgB) {
		t.Error("two builds of the busybox image differ")
	}
	files, _ := readTar(t, imgA)
	blob := func(digest string) []byte {
		t.Helper()
		data, ok := files["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
		if !ok {
			t.Fatalf("blob %s missing", digest)
		}
		if digestOf(data) != digest {
			t.Fatalf("blob %s has digest %s", digest, digestOf(data))
		}
		return data
	}
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %q", files["oci-layout"])
	}
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v %s", err, files["index.json"])
	}
	if got := index.Manifests[0].Annotations["io.containerd.image.name"]; got != BusyboxImage {
		t.Errorf("image name annotation = %q, want %q", got, BusyboxImage)
	}
	var manifest struct {
		Config struct{ Digest string }
		Layers []struct{ Digest, MediaType string }
	}
	if err := json.Unmarshal(blob(index.Manifests[0].Digest), &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("manifest: %v", err)
	}
	var config struct {
		Rootfs struct {
			DiffIDs []string `json:"diff_ids"`
		}
		Config struct{ Cmd []string }
	}
	if err := json.Unmarshal(blob(manifest.Config.Digest), &config); err != nil {
		t.Fatal(err)
	}
	if len(config.Rootfs.DiffIDs) != 1 || config.Rootfs.DiffIDs[0] != manifest.Layers[0].Digest {
		t.Errorf("diff_ids %v do not match the uncompressed layer %s", config.Rootfs.DiffIDs, manifest.Layers[0].Digest)
	}
	if strings.Join(config.Config.Cmd, " ") != "sleep infinity" {
		t.Errorf("default command = %v, want sleep infinity (the image is also the sandbox image)", config.Config.Cmd)
	}
	layerFiles, layerLinks := readTar(t, blob(manifest.Layers[0].Digest))
	if _, ok := layerFiles["bin/busybox"]; !ok {
		t.Error("layer lacks bin/busybox")
	}
	for _, applet := range []string{"bin/sh", "bin/sleep", "bin/echo", "sbin/ip"} {
		if layerLinks[applet] != "/bin/busybox" {
			t.Errorf("layer link %s -> %q, want /bin/busybox", applet, layerLinks[applet])
		}
	}
}

func TestKubeletLogShowsConnectedOnlyAfterOffset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubelet.log")
	before := `I1122 05:51:18.1 1 dra_plugin_manager.go:140] "Connection changed" driverName="gpu.tessera.dev" endpoint="/var/lib/kubelet/plugins/gpu.tessera.dev/dra.sock" connected=true` + "\n"
	if err := os.WriteFile(path, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	if !kubeletLogShowsConnected(path, 0) {
		t.Error("registration line not recognised")
	}
	offset := fileSize(path)
	if kubeletLogShowsConnected(path, offset) {
		t.Error("a registration logged before the offset counted")
	}
	other := `I1122 05:52:00.1 1 dra_plugin_manager.go:140] "Connection changed" driverName="other.example.com" endpoint="x" connected=true` + "\n" +
		`I1122 05:52:00.2 1 dra_plugin_manager.go:140] "Connection changed" driverName="gpu.tessera.dev" endpoint="x" connected=false` + "\n"
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.WriteString(other)
	if kubeletLogShowsConnected(path, offset) {
		t.Error("another driver or a disconnect counted as registration")
	}
	_, _ = f.WriteString(before)
	f.Close()
	if !kubeletLogShowsConnected(path, offset) {
		t.Error("registration after the offset not recognised")
	}
}

func TestUnderAnyKeepsMountsBelowTheRoots(t *testing.T) {
	keep := underAny([]string{KubeletRootDir, "/run/containerd"})
	for point, want := range map[string]bool{
		KubeletRootDir:                      true,
		"/var/lib/kubelet/pods/a b/volumes": true,
		"/run/containerd/io.containerd.x":   true,
		"/var/lib/kubelet2":                 false,
		"/run":                              false,
	} {
		if skip, _ := keep(&mountinfo.Info{Mountpoint: point}); skip == want {
			t.Errorf("%s: kept=%v, want %v", point, !skip, want)
		}
	}
	if !under("/var/lib/kubelet/pods", KubeletRootDir) || under("/var/lib/kubelet2", KubeletRootDir) {
		t.Error("under() is not a path-prefix test")
	}
}

func TestNoopCNIReportsEth0AndCreatesNothing(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "noopcni")
	if out, err := exec.Command("go", "build", "-o", bin, "./noopcni").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	run := func(command, stdin string) string {
		cmd := exec.Command(bin)
		cmd.Env = []string{"CNI_COMMAND=" + command, "CNI_NETNS=/var/run/netns/x"}
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v", command, err)
		}
		return string(out)
	}
	var res struct {
		CNIVersion string
		Interfaces []struct{ Name, Sandbox string }
		IPs        []struct {
			Address   string
			Interface int
		}
	}
	if err := json.Unmarshal([]byte(run("ADD", `{"cniVersion":"1.0.0","name":"n","type":"tessera-noop"}`)), &res); err != nil {
		t.Fatal(err)
	}
	if res.CNIVersion != "1.0.0" || len(res.Interfaces) != 1 || res.Interfaces[0].Name != "eth0" ||
		res.Interfaces[0].Sandbox != "/var/run/netns/x" || len(res.IPs) != 1 || res.IPs[0].Address != "127.0.0.1/8" {
		t.Errorf("unexpected ADD result %+v", res)
	}
	if out := run("DEL", `{}`); out != "" {
		t.Errorf("DEL printed %q", out)
	}
	if !strings.Contains(run("VERSION", ""), `"1.0.0"`) {
		t.Error("VERSION does not list 1.0.0")
	}
}
