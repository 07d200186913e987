// Package nvmlsource opens the NVML implementation the plugin talks to: the
// node's NVIDIA management library, or the mock GPUs. Everything above this
// package sees only nvml.Interface.
package nvmlsource

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-dev/tessera/pkg/gpu/discover"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
)

// Kinds of backend.
const (
	NVML = "nvml"
	Mock = "mock"
)

// Options select and configure the backend.
type Options struct {
	Kind string
	// NVMLLibrary overrides the path of libnvidia-ml.so.1.
	NVMLLibrary string
	// MockProfile is the --mock-profile value, e.g. "t4:2" or "dgxh100".
	MockProfile string
	// MockConfig is a YAML node description; it wins over MockProfile.
	MockConfig string
	// MockMIG is "all" or "none".
	MockMIG string
	// MockStateDir keeps mock MIG state across restarts ("" = in memory).
	MockStateDir string
	// Seed makes mock UUIDs stable; the node name.
	Seed string
	// MockProcRoot, when set, is the /proc whose processes that set
	// nvmlmock.EnvMemoryUsed the mock reports as compute processes.
	MockProcRoot string
}

// Backend is an initialised NVML implementation.
type Backend struct {
	nvml.Interface
	// Mock is set in mock mode, for fault injection.
	Mock *nvmlmock.Server
	// stateDir is Options.MockStateDir.
	stateDir string
}

// SysFS is where discovery reads the GPUs' topology: the mock GPUs' own,
// else the host's /sys.
func (b *Backend) SysFS() fs.ReadLinkFS {
	if b.Mock != nil {
		return b.Mock.SysFS()
	}
	return discover.HostSysFS()
}

// Close shuts the library down.
func (b *Backend) Close() error {
	if ret := b.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("NVML shutdown: %s", nvml.ErrorString(ret))
	}
	return nil
}

// WatchFaults applies, until ctx ends, the XID errors written into the
// mock state directory's inject file (how the end-to-end tests make a mock
// GPU fail; see nvmlmock.InjectFileName), polling every interval. With
// real NVML, or without a state directory, there is nothing to watch and
// it returns at once.
func (b *Backend) WatchFaults(ctx context.Context, interval time.Duration) {
	if b.Mock == nil || b.stateDir == "" {
		return
	}
	b.Mock.WatchInjectFile(ctx, filepath.Join(b.stateDir, nvmlmock.InjectFileName), interval)
}

// Open initialises the selected backend. Errors name the flag to fix.
func Open(opts Options) (*Backend, error) {
	switch opts.Kind {
	case Mock:
		return openMock(opts)
	case NVML:
		var lib nvml.Interface
		if opts.NVMLLibrary != "" {
			lib = nvml.New(nvml.WithLibraryPath(opts.NVMLLibrary))
		} else {
			lib = nvml.New()
		}
		if ret := lib.Init(); ret != nvml.SUCCESS {
			if errors.Is(ret, nvml.ERROR_LIBRARY_NOT_FOUND) || ret == nvml.ERROR_LIBRARY_NOT_FOUND {
				return nil, fmt.Errorf("--gpu-backend=nvml: the NVIDIA management library (libnvidia-ml.so.1) could not be loaded: install the NVIDIA driver on the node, point --nvml-library at it, or run with --gpu-backend=mock")
			}
			return nil, fmt.Errorf("--gpu-backend=nvml: NVML failed to initialise: %s", nvml.ErrorString(ret))
		}
		return &Backend{Interface: lib}, nil
	default:
		return nil, fmt.Errorf("--gpu-backend=%q is not valid: use nvml or mock", opts.Kind)
	}
}

func openMock(opts Options) (*Backend, error) {
	var (
		spec nvmlmock.NodeSpec
		err  error
	)
	if opts.MockConfig != "" {
		spec, err = nvmlmock.LoadNodeSpec(opts.MockConfig)
	} else {
		spec, err = nvmlmock.ParseProfile(opts.MockProfile)
	}
	if err != nil {
		return nil, err
	}
	var mig bool
	switch opts.MockMIG {
	case "", "none":
	case "all":
		mig = true
		capable := false
		for _, m := range spec.Models() {
			capable = capable || len(nvmlmock.Models[m].MIG) > 0
		}
		if !capable {
			return nil, fmt.Errorf("--mock-mig=all: none of the GPUs in %q supports MIG; use a MIG-capable model (a100-40gb, a100-80gb, h100-80gb, h200-141gb, b200-180gb or a dgx* node) or --mock-mig=none", opts.MockProfile)
		}
	default:
		return nil, fmt.Errorf("--mock-mig=%q is not valid: use all or none", opts.MockMIG)
	}
	mo := nvmlmock.Options{Spec: spec, Seed: opts.Seed, MIGEnabled: mig, ProcRoot: opts.MockProcRoot}
	if opts.MockStateDir != "" {
		mo.StatePath = filepath.Join(opts.MockStateDir, "mock-gpu-state.json")
	}
	srv, err := nvmlmock.New(mo)
	if err != nil {
		return nil, err
	}
	return &Backend{Interface: srv, Mock: srv, stateDir: opts.MockStateDir}, nil
}
