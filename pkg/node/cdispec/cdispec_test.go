package cdispec

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

func TestNames(t *testing.T) {
	uid := "0b6e4d9c-6f1a-4c4e-9f64-6ad0b5b8f3e1"
	name := SpecName(uid)
	if name != "k8s.gpu.tessera.dev-claim_"+uid+".json" {
		t.Errorf("spec name %s", name)
	}
	if got, ok := ClaimUIDFromSpecName(name); !ok || got != uid {
		t.Errorf("round trip: %q %v", got, ok)
	}
	for _, other := range []string{"nvidia.yaml", "k8s.gpu.tessera.dev-claim_.json", "k8s.gpu.tessera.dev-claim_x.yaml", ".k8s.gpu.tessera.dev-claim_x.json.tmp-1"} {
		if _, ok := ClaimUIDFromSpecName(other); ok {
			t.Errorf("%s taken for a claim spec", other)
		}
	}
	if got := DeviceName(uid, "gpu-0", ""); got != uid+"-gpu-0" {
		t.Error(got)
	}
	if got := QualifiedName(DeviceName(uid, "gpu-0", "abc")); got != "k8s.gpu.tessera.dev/claim="+uid+"-gpu-0-abc" {
		t.Error(got)
	}
}

// TestSpecInjects writes a spec with mock nodes and has the CDI library a
// container runtime uses inject it into an OCI spec.
func TestSpecInjects(t *testing.T) {
	dir := Dir{Path: t.TempDir()}
	nodes := NewMockNodes(t.TempDir())
	uid := "uid-1"
	control, err := nodes.Control()
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := nodes.GPU(0)
	if err != nil {
		t.Fatal(err)
	}
	caps, err := nodes.MIG(1, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range append(append(append([]*cdispec.DeviceNode{}, control...), gpu...), caps...) {
		if _, err := os.Stat(n.HostPath); err != nil {
			t.Errorf("fake node: %v", err)
		}
		if !strings.HasPrefix(n.HostPath, nodes.Root) {
			t.Errorf("host path %s outside the mock root", n.HostPath)
		}
	}
	if caps[0].Path != "/dev/nvidia-caps/nvidia-cap"+itoa(MIGCapMinor(1, 2, -1)) {
		t.Errorf("cap path %s", caps[0].Path)
	}
	spec, err := NewSpec(cdispec.ContainerEdits{Env: []string{"A=1"}, DeviceNodes: control},
		[]cdispec.Device{
			{Name: DeviceName(uid, "gpu-0", "s1"), ContainerEdits: cdispec.ContainerEdits{DeviceNodes: gpu}},
			{Name: DeviceName(uid, "gpu-1-mig-1g10gb-2", ""), ContainerEdits: cdispec.ContainerEdits{DeviceNodes: caps}},
		}, map[string]string{AnnotationClaim: "ns/c"})
	if err != nil {
		t.Fatal(err)
	}
	name := SpecName(uid)
	if err := dir.Write(name, spec); err != nil {
		t.Fatal(err)
	}
	back, err := dir.Read(name)
	if err != nil {
		t.Fatal(err)
	}
	if back.Annotations[AnnotationClaim] != "ns/c" || len(back.Devices) != 2 {
		t.Errorf("read back %+v", back)
	}
	if uids, err := dir.ClaimUIDs(); err != nil || !slices.Equal(uids, []string{uid}) {
		t.Errorf("claims %v %v", uids, err)
	}

	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir.Path), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI cache errors: %v", errs)
	}
	ociSpec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(ociSpec, QualifiedName(DeviceName(uid, "gpu-0", "s1"))); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ociSpec.Process.Env, "A=1") {
		t.Errorf("env %v", ociSpec.Process.Env)
	}
	var paths []string
	for _, d := range ociSpec.Linux.Devices {
		paths = append(paths, d.Path)
	}
	for _, want := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0"} {
		if !slices.Contains(paths, want) {
			t.Errorf("device %s not injected: %v", want, paths)
		}
	}
	if slices.Contains(paths, caps[0].Path) {
		t.Error("MIG capability of another device injected")
	}

	tmp := filepath.Join(dir.Path, "."+name+".tmp-123")
	if err := os.WriteFile(tmp, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := dir.RemoveTemporary(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Error("temporary file left")
	}
	if err := dir.Remove(name); err != nil {
		t.Fatal(err)
	}
	if err := dir.Remove(name); err != nil {
		t.Fatalf("removing twice: %v", err)
	}
	if dir.Exists(name) {
		t.Error("spec still there")
	}
}

func TestValidateRejects(t *testing.T) {
	node := []*cdispec.DeviceNode{{Path: "/dev/nvidia0"}}
	tests := map[string][]cdispec.Device{
		"no devices":     nil,
		"bad name":       {{Name: "a/b", ContainerEdits: cdispec.ContainerEdits{DeviceNodes: node}}},
		"empty edits":    {{Name: "a"}},
		"duplicate name": {{Name: "a", ContainerEdits: cdispec.ContainerEdits{DeviceNodes: node}}, {Name: "a", ContainerEdits: cdispec.ContainerEdits{DeviceNodes: node}}},
		"bad env":        {{Name: "a", ContainerEdits: cdispec.ContainerEdits{Env: []string{"NOEQUALS"}}}},
	}
	for name, devices := range tests {
		if _, err := NewSpec(cdispec.ContainerEdits{}, devices, nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestHostNodes(t *testing.T) {
	root := t.TempDir()
	proc := filepath.Join(root, "proc")
	dev := filepath.Join(root, "dev")
	must(t, os.MkdirAll(filepath.Join(proc, "driver/nvidia-caps"), 0o755))
	must(t, os.MkdirAll(dev, 0o755))
	must(t, os.WriteFile(filepath.Join(proc, "devices"), []byte("Character devices:\n  1 mem\n195 nvidia-frontend\n237 nvidia-caps\n\nBlock devices:\n237 nvidia-caps-fake\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(proc, "driver/nvidia-caps/mig-minors"), []byte("config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dev, "nvidiactl"), nil, 0o644))
	// nvidia-uvm and nvidia-uvm-tools do not exist yet: they are created,
	// not left out.
	var created []string
	h := HostNodes{DevRoot: root, ProcRoot: proc, CreateControl: func(devRoot string) error {
		created = append(created, devRoot)
		for _, n := range []string{"nvidia-uvm", "nvidia-uvm-tools"} {
			must(t, os.WriteFile(filepath.Join(devRoot, "dev", n), nil, 0o644))
		}
		return nil
	}}
	ctl, err := h.Control()
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, n := range ctl {
		paths = append(paths, n.Path+"="+n.HostPath)
	}
	if !slices.Equal(paths, []string{"/dev/nvidiactl=", "/dev/nvidia-uvm=", "/dev/nvidia-uvm-tools="}) {
		t.Errorf("control nodes %v", paths)
	}
	if !slices.Equal(created, []string{root}) {
		t.Errorf("control nodes created under %v, want once under %s", created, root)
	}
	// Everything exists now: nothing more is created.
	if _, err := h.Control(); err != nil || len(created) != 1 {
		t.Errorf("second Control: %v, created %v", err, created)
	}
	// Another dev root on the host: specs name the host's paths.
	h.HostDevRoot = "/run/nvidia/driver"
	ctl, err = h.Control()
	if err != nil {
		t.Fatal(err)
	}
	gpu, _ := h.GPU(3)
	if ctl[1].HostPath != "/run/nvidia/driver/dev/nvidia-uvm" || gpu[0].HostPath != "/run/nvidia/driver/dev/nvidia3" || gpu[0].Path != "/dev/nvidia3" {
		t.Errorf("host paths under another dev root: %+v %+v", ctl[1], gpu[0])
	}
	// The module is not loaded: the error says so instead of leaving the
	// node out.
	must(t, os.Remove(filepath.Join(dev, "nvidia-uvm")))
	h.CreateControl = func(string) error { return errors.New("failed to determine major") }
	if _, err := h.Control(); err == nil || !strings.Contains(err.Error(), "nvidia-uvm") || !strings.Contains(err.Error(), "modprobe nvidia-uvm") {
		t.Errorf("Control without the UVM module: %v, want an error naming nvidia-uvm and the fix", err)
	}
	caps, err := h.MIG(0, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(caps) != 2 || caps[0].Minor != 12 || caps[1].Minor != 13 || caps[0].Major != 237 || caps[1].Path != "/dev/nvidia-caps/nvidia-cap13" {
		t.Errorf("caps %+v %+v", caps[0], caps[1])
	}
	if _, err := h.MIG(0, 2, 0); err == nil || !strings.Contains(err.Error(), "gpu0/gi2/access") {
		t.Errorf("missing minor: %v", err)
	}
	if MIGCapMinor(0, 1, -1) != 12 || MIGCapMinor(0, 1, 0) != 13 || MIGCapMinor(0, 0, -1) != 3 {
		t.Error("MIGCapMinor does not follow the driver's numbering")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
