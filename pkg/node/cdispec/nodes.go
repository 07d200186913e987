package cdispec

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/NVIDIA/nvidia-container-toolkit/pkg/system/nvdevices"
	"golang.org/x/sys/unix"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// DeviceNodes says which device nodes a container needs for a GPU.
type DeviceNodes interface {
	// Control are the nodes every CUDA container needs: /dev/nvidiactl,
	// /dev/nvidia-uvm, /dev/nvidia-uvm-tools.
	Control() ([]*cdispec.DeviceNode, error)
	// GPU is /dev/nvidia<minor>.
	GPU(minor int) ([]*cdispec.DeviceNode, error)
	// MIG are the capability nodes of a GPU instance and its compute
	// instance: /dev/nvidia-caps/nvidia-cap<N>.
	MIG(gpuMinor, gi, ci int) ([]*cdispec.DeviceNode, error)
}

// HostNodes are the real nodes of a GPU node. The runtime reads their
// type and numbers from the host, except for MIG capability nodes, which
// are fully specified (major from /proc/devices, minors from
// /proc/driver/nvidia-caps/mig-minors) so that they need not exist on the
// host: the runtime creates them in the container, as NVIDIA's DRA driver
// does.
type HostNodes struct {
	// DevRoot is where the plugin sees the root that holds the host's dev/
	// directory ("/" when the plugin runs on the host, the chart mounts it
	// at /host-dev-root).
	DevRoot string
	// HostDevRoot is that root on the host (--dev-root): "/" or, with the
	// GPU operator's driver container, possibly /run/nvidia/driver. Empty
	// means "/".
	HostDevRoot string
	// ProcRoot is where the plugin sees the host's /proc ("/proc").
	ProcRoot string
	// CreateControl creates the missing control nodes (nvidiactl,
	// nvidia-modeset, nvidia-uvm, nvidia-uvm-tools) under the root that
	// holds dev/. Nil: the NVIDIA container toolkit's nvdevices, which
	// reads the majors from /proc/devices, as `nvidia-ctk system
	// create-device-nodes --control-devices` does.
	CreateControl func(devRoot string) error
}

var _ DeviceNodes = HostNodes{}

// controlNodes are the nodes every CUDA container needs.
var controlNodes = []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}

func (h HostNodes) hostPath(name string) string {
	if h.HostDevRoot == "" || h.HostDevRoot == "/" {
		return ""
	}
	return filepath.Join(h.HostDevRoot, "dev", name)
}

// Control implements DeviceNodes. The nvidia-uvm nodes appear only once
// something loads the nvidia-uvm module and opens it; a container must not
// miss them for that, so missing control nodes are created on the host
// first, the way the NVIDIA container toolkit creates them. An error says
// what to do when that is impossible (the module is not loaded).
func (h HostNodes) Control() ([]*cdispec.DeviceNode, error) {
	var missing []string
	for _, n := range controlNodes {
		if _, err := os.Stat(filepath.Join(h.DevRoot, "dev", n)); err != nil {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		create := h.CreateControl
		if create == nil {
			create = createControlNodes
		}
		if err := create(h.DevRoot); err != nil {
			return nil, fmt.Errorf("create missing NVIDIA device nodes %v under %s/dev: %w (is the driver loaded? `modprobe nvidia-uvm` on the node loads the UVM module)", missing, h.DevRoot, err)
		}
		for _, n := range missing {
			if _, err := os.Stat(filepath.Join(h.DevRoot, "dev", n)); err != nil {
				return nil, fmt.Errorf("NVIDIA device node %s/dev/%s is still missing after creating it: %w", h.DevRoot, n, err)
			}
		}
	}
	out := make([]*cdispec.DeviceNode, 0, len(controlNodes))
	for _, n := range controlNodes {
		out = append(out, &cdispec.DeviceNode{Path: "/dev/" + n, HostPath: h.hostPath(n)})
	}
	return out, nil
}

func createControlNodes(devRoot string) error {
	d, err := nvdevices.New(nvdevices.WithDevRoot(devRoot))
	if err != nil {
		return err
	}
	return d.CreateNVIDIAControlDevices()
}

// GPU implements DeviceNodes.
func (h HostNodes) GPU(minor int) ([]*cdispec.DeviceNode, error) {
	name := fmt.Sprintf("nvidia%d", minor)
	return []*cdispec.DeviceNode{{Path: "/dev/" + name, HostPath: h.hostPath(name)}}, nil
}

// MIG implements DeviceNodes.
func (h HostNodes) MIG(gpuMinor, gi, ci int) ([]*cdispec.DeviceNode, error) {
	major, err := procDeviceMajor(filepath.Join(h.ProcRoot, "devices"), "nvidia-caps")
	if err != nil {
		return nil, err
	}
	minors, err := ReadMIGMinors(filepath.Join(h.ProcRoot, "driver/nvidia-caps/mig-minors"))
	if err != nil {
		return nil, err
	}
	var out []*cdispec.DeviceNode
	for _, key := range []string{
		fmt.Sprintf("gpu%d/gi%d/access", gpuMinor, gi),
		fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpuMinor, gi, ci),
	} {
		m, ok := minors[key]
		if !ok {
			return nil, fmt.Errorf("MIG capability %s is not listed in %s/driver/nvidia-caps/mig-minors", key, h.ProcRoot)
		}
		out = append(out, capNode(m, major, ""))
	}
	return out, nil
}

func capNode(minor int, major int64, hostPath string) *cdispec.DeviceNode {
	mode := os.FileMode(0o444)
	return &cdispec.DeviceNode{
		Path:        fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor),
		HostPath:    hostPath,
		Type:        "c",
		Major:       major,
		Minor:       int64(minor),
		FileMode:    &mode,
		Permissions: "r",
	}
}

// ReadMIGMinors parses /proc/driver/nvidia-caps/mig-minors: lines
// "gpu0/gi1/access 12" and "gpu0/gi1/ci0/access 13".
func ReadMIGMinors(path string) (map[string]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("MIG capability minors: %w", err)
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 {
			continue
		}
		n, err := strconv.Atoi(fields[1])
		if err != nil {
			continue
		}
		out[fields[0]] = n
	}
	return out, sc.Err()
}

// MIGCapMinor is the minor the NVIDIA driver gives a MIG capability:
// config 1, monitor 2, then per GPU 15 GPU instances of 9 minors each (the
// GPU instance's access, then its 8 compute instances). ci < 0 asks for the
// GPU instance's own minor. Mock mode uses it; real nodes read mig-minors.
func MIGCapMinor(gpuMinor, gi, ci int) int {
	base := 3 + gpuMinor*15*9 + gi*9
	if ci < 0 {
		return base
	}
	return base + 1 + ci
}

func procDeviceMajor(path, name string) (int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("device majors: %w", err)
	}
	inChar := false
	for _, line := range strings.Split(string(data), "\n") {
		switch strings.TrimSpace(line) {
		case "Character devices:":
			inChar = true
			continue
		case "Block devices:":
			inChar = false
			continue
		}
		fields := strings.Fields(line)
		if inChar && len(fields) == 2 && fields[1] == name {
			return strconv.ParseInt(fields[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("%s has no character device %q: is the NVIDIA driver loaded?", path, name)
}

// MockNodes are fake device nodes under Root (--mock-device-root), so
// that containers start on a machine without GPUs. Each is a character
// device with the numbers of /dev/null (a regular file where mknod is not
// permitted); specs name them fully so the runtime needs no GPU driver,
// and a container opening one gets /dev/null's behaviour.
type MockNodes struct {
	Root string

	once         sync.Once
	major, minor int64
	mu           sync.Mutex
	created      map[string]bool
}

var _ DeviceNodes = (*MockNodes)(nil)

// NewMockNodes returns mock nodes under root.
func NewMockNodes(root string) *MockNodes {
	return &MockNodes{Root: root, created: map[string]bool{}}
}

func (m *MockNodes) numbers() (int64, int64) {
	m.once.Do(func() {
		m.major, m.minor = 1, 3
		var st unix.Stat_t
		if err := unix.Stat("/dev/null", &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR {
			m.major, m.minor = int64(unix.Major(uint64(st.Rdev))), int64(unix.Minor(uint64(st.Rdev)))
		}
	})
	return m.major, m.minor
}

// node creates the fake node for a container path and returns its spec.
func (m *MockNodes) node(containerPath string) (*cdispec.DeviceNode, error) {
	major, minor := m.numbers()
	host := filepath.Join(m.Root, containerPath)
	if err := m.ensure(host, major, minor); err != nil {
		return nil, err
	}
	mode := os.FileMode(0o666)
	return &cdispec.DeviceNode{Path: containerPath, HostPath: host, Type: "c", Major: major, Minor: minor, FileMode: &mode}, nil
}

func (m *MockNodes) ensure(host string, major, minor int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.created[host] {
		return nil
	}
	if _, err := os.Lstat(host); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
			return fmt.Errorf("--mock-device-root: %w", err)
		}
		err := unix.Mknod(host, unix.S_IFCHR|0o666, int(unix.Mkdev(uint32(major), uint32(minor))))
		if err != nil && !errors.Is(err, fs.ErrExist) {
			// Not permitted (no CAP_MKNOD): a regular file will do, the
			// spec carries the numbers.
			f, ferr := os.OpenFile(host, os.O_CREATE|os.O_WRONLY, 0o666)
			if ferr != nil {
				return fmt.Errorf("--mock-device-root: create fake device %s: %w", host, ferr)
			}
			_ = f.Close()
		}
	} else if err != nil {
		return fmt.Errorf("--mock-device-root: %w", err)
	}
	m.created[host] = true
	return nil
}

// Control implements DeviceNodes.
func (m *MockNodes) Control() ([]*cdispec.DeviceNode, error) {
	var out []*cdispec.DeviceNode
	for _, p := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} {
		n, err := m.node(p)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// GPU implements DeviceNodes.
func (m *MockNodes) GPU(minor int) ([]*cdispec.DeviceNode, error) {
	n, err := m.node(fmt.Sprintf("/dev/nvidia%d", minor))
	if err != nil {
		return nil, err
	}
	return []*cdispec.DeviceNode{n}, nil
}

// MIG implements DeviceNodes.
func (m *MockNodes) MIG(gpuMinor, gi, ci int) ([]*cdispec.DeviceNode, error) {
	var out []*cdispec.DeviceNode
	for _, c := range []int{-1, ci} {
		n, err := m.node(fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", MIGCapMinor(gpuMinor, gi, c)))
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}
