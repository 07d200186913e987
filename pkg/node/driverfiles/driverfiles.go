// Package driverfiles computes the container edits that give a container
// the node's NVIDIA driver: the user-space libraries (libcuda.so,
// libnvidia-ml.so, ...), binaries (nvidia-smi), GSP firmware, IPC sockets
// (nvidia-persistenced, fabric manager) where present, and the
// nvidia-cdi-hook hooks that create the .so symlinks and update the
// container's ld cache. It asks NVIDIA's own library for them
// (nvidia-container-toolkit's pkg/nvcdi, what NVIDIA's DRA driver uses),
// so Tessera mounts exactly what the NVIDIA container toolkit would.
//
// Device nodes are not part of these edits: package cdispec says which
// nodes each claim gets.
package driverfiles

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	transformroot "github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform/root"
	"k8s.io/klog/v2"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"
)

// Options say where the driver is.
type Options struct {
	// DriverRoot is the driver installation's root on the host: / for a
	// driver installed on the host, /run/nvidia/driver for the GPU
	// operator's driver container. Specs name files under it.
	DriverRoot string
	// ContainerDriverRoot is where the plugin sees DriverRoot (the chart
	// mounts it at /driver-root). Empty: DriverRoot itself.
	ContainerDriverRoot string
	// HookPath is the nvidia-cdi-hook executable as the container runtime
	// sees it: a path on the host.
	HookPath string
	// NVML reports the driver version; the mock backend's NVML works too.
	NVML nvml.Interface
	// DisabledHooks are createContainer hooks left out of every spec
	// (nvidia-cdi-hook subcommands, Hooks). Empty: all that nvcdi adds.
	DisabledHooks []string
}

// Hook is an nvidia-cdi-hook createContainer hook a spec may carry, with
// what a container loses without it.
type Hook struct{ Name, Without string }

// KnownHooks are the hooks --disabled-cdi-hooks may name.
func KnownHooks() []Hook {
	return []Hook{
		{string(nvcdi.CreateSymlinksHook), "the driver's .so symlinks (libcuda.so.1 -> libcuda.so.<version>): CUDA cannot load the driver unless the image makes them"},
		{string(nvcdi.UpdateLDCacheHook), "the container's ld cache does not list the driver's libraries: CUDA cannot load them unless the image sets LD_LIBRARY_PATH or runs ldconfig"},
		{string(nvcdi.EnableCudaCompatHook), "CUDA forward compatibility (a CUDA compat package in the image newer than the driver) is not enabled"},
		{string(nvcdi.DisableDeviceNodeModificationHook), "libnvidia-ml and nvidia-smi in the container may try to create device nodes"},
		{"update-application-profile", "no per-container driver application profile"},
	}
}

// Driver computes and caches the driver's edits.
type Driver struct {
	opts Options

	mu      sync.Mutex
	version string
	edits   cdispecs.ContainerEdits
}

// New checks the options.
func New(opts Options) (*Driver, error) {
	if opts.DriverRoot == "" || !filepath.IsAbs(opts.DriverRoot) {
		return nil, fmt.Errorf("--driver-root=%q must be an absolute path (/ or /run/nvidia/driver)", opts.DriverRoot)
	}
	if opts.ContainerDriverRoot == "" {
		opts.ContainerDriverRoot = opts.DriverRoot
	}
	if !filepath.IsAbs(opts.ContainerDriverRoot) {
		return nil, fmt.Errorf("--container-driver-root=%q must be an absolute path", opts.ContainerDriverRoot)
	}
	if opts.HookPath == "" || !filepath.IsAbs(opts.HookPath) {
		return nil, fmt.Errorf("--nvidia-cdi-hook-path=%q must be an absolute path on the host", opts.HookPath)
	}
	if opts.NVML == nil {
		return nil, fmt.Errorf("driverfiles: no NVML")
	}
	known := KnownHooks()
	for _, h := range opts.DisabledHooks {
		if !slices.ContainsFunc(known, func(k Hook) bool { return k.Name == h }) {
			names := make([]string, len(known))
			for i, k := range known {
				names[i] = k.Name
			}
			return nil, fmt.Errorf("--disabled-cdi-hooks: %q is not an nvidia-cdi-hook createContainer hook: use %s", h, strings.Join(names, ", "))
		}
	}
	return &Driver{opts: opts}, nil
}

// Edits returns the driver's edits, computed again whenever NVML reports
// another driver version (a driver upgraded under a running plugin), so
// every claim prepared after the change gets the new files. The caller
// must not modify the result.
func (d *Driver) Edits(ctx context.Context) (cdispecs.ContainerEdits, error) {
	version, ret := d.opts.NVML.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return cdispecs.ContainerEdits{}, fmt.Errorf("driver version from NVML: %s", nvml.ErrorString(ret))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if version == d.version {
		return d.edits, nil
	}
	edits, err := d.generate(ctx)
	if err != nil {
		return cdispecs.ContainerEdits{}, fmt.Errorf("driver files of NVIDIA driver %s under %s: %w", version, d.opts.DriverRoot, err)
	}
	klog.FromContext(ctx).Info("NVIDIA driver files for containers", "version", version, "driverRoot", d.opts.DriverRoot,
		"mounts", len(edits.Mounts), "hooks", len(edits.Hooks))
	d.version, d.edits = version, edits
	return edits, nil
}

func (d *Driver) generate(ctx context.Context) (cdispecs.ContainerEdits, error) {
	lib, err := nvcdi.New(
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithNvmlLib(d.opts.NVML),
		nvcdi.WithDriverRoot(d.opts.ContainerDriverRoot),
		nvcdi.WithNVIDIACDIHookPath(d.opts.HookPath),
		nvcdi.WithLogger(logger{klog.FromContext(ctx).WithName("nvcdi")}),
		// The sandbox utilities only speed up device queries; Tessera does
		// not use nvcdi for devices.
		nvcdi.WithFeatureFlags(nvcdi.FeatureDisableNvsandboxUtils),
		nvcdi.WithDisabledHooks(d.opts.DisabledHooks...),
	)
	if err != nil {
		return cdispecs.ContainerEdits{}, err
	}
	common, err := lib.GetCommonEdits()
	if err != nil {
		return cdispecs.ContainerEdits{}, err
	}
	spec := &cdispecs.Spec{ContainerEdits: *common.ContainerEdits}
	// The plugin found the files under its own view of the driver root;
	// the runtime reads them on the host.
	if d.opts.ContainerDriverRoot != d.opts.DriverRoot {
		err := transformroot.New(
			transformroot.WithRoot(d.opts.ContainerDriverRoot),
			transformroot.WithTargetRoot(d.opts.DriverRoot),
			transformroot.WithRelativeTo("host"),
		).Transform(spec)
		if err != nil {
			return cdispecs.ContainerEdits{}, err
		}
	}
	edits := spec.ContainerEdits
	// Device nodes come from package cdispec, per claim.
	edits.DeviceNodes = nil
	// nvcdi adds NVIDIA_VISIBLE_DEVICES=void; Tessera sets that variable
	// per claim to the allocated device's UUID (CUDA and tools read it), so
	// the driver's edits must not override it.
	edits.Env = slices.DeleteFunc(slices.Clone(edits.Env), func(kv string) bool {
		return strings.HasPrefix(kv, "NVIDIA_VISIBLE_DEVICES=")
	})
	return edits, nil
}

// Merge appends the driver's edits to a claim's edits.
func Merge(claim *cdispecs.ContainerEdits, driver cdispecs.ContainerEdits) {
	claim.Env = append(claim.Env, driver.Env...)
	claim.Mounts = append(claim.Mounts, driver.Mounts...)
	claim.Hooks = append(claim.Hooks, driver.Hooks...)
	claim.DeviceNodes = append(claim.DeviceNodes, driver.DeviceNodes...)
	claim.AdditionalGIDs = append(claim.AdditionalGIDs, driver.AdditionalGIDs...)
}

// logger hands nvcdi's messages to klog.
type logger struct{ l klog.Logger }

func (g logger) Debugf(f string, a ...any)   { g.l.V(5).Info(fmt.Sprintf(f, a...)) }
func (g logger) Tracef(f string, a ...any)   { g.l.V(6).Info(fmt.Sprintf(f, a...)) }
func (g logger) Infof(f string, a ...any)    { g.l.V(5).Info(fmt.Sprintf(f, a...)) }
func (g logger) Warningf(f string, a ...any) { g.l.V(2).Info("Warning: " + fmt.Sprintf(f, a...)) }
func (g logger) Errorf(f string, a ...any)   { g.l.Error(nil, fmt.Sprintf(f, a...)) }
