// Package cdispec writes Tessera's per-claim transient CDI specs: one spec
// file per prepared claim in the CDI spec directory, one CDI device per
// allocated device and share, written atomically so that a container
// runtime never reads half a spec.
package cdispec

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Vendor and Class make the CDI kind of Tessera's devices:
// k8s.gpu.tessera.dev/claim=<claimUID>-<device>[-<shareID>].
const (
	Vendor = "k8s.gpu.tessera.dev"
	Class  = "claim"
)

// Annotation keys Tessera puts on its specs. They make a spec on disk
// enough to undo a prepare when the checkpoint is lost.
const (
	AnnotationClaim        = "gpu.tessera.dev/claim"
	AnnotationMIGInstances = "gpu.tessera.dev/mig-instances"
	// AnnotationReservation is what the claim holds on the node (its
	// checkpoint's devices, as JSON): a claim whose checkpoint is lost
	// keeps it until it is repaired.
	AnnotationReservation = "gpu.tessera.dev/reservation"
)

const specExt = ".json"

// SpecName is the file name of a claim's transient spec.
func SpecName(claimUID string) string {
	return cdi.GenerateTransientSpecName(Vendor, Class, claimUID) + specExt
}

// ClaimUIDFromSpecName returns the claim UID of a spec file name written
// by SpecName, or false for any other file.
func ClaimUIDFromSpecName(name string) (string, bool) {
	prefix := cdi.GenerateTransientSpecName(Vendor, Class, "")
	if !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, specExt) {
		return "", false
	}
	uid := strings.TrimSuffix(strings.TrimPrefix(name, prefix), specExt)
	if uid == "" || strings.ContainsAny(uid, "/.") {
		return "", false
	}
	return uid, true
}

// DeviceName is the CDI device name of one allocated device (and share).
func DeviceName(claimUID, device, shareID string) string {
	if shareID == "" {
		return claimUID + "-" + device
	}
	return claimUID + "-" + device + "-" + shareID
}

// QualifiedName is the CDI device ID the kubelet passes to the runtime.
func QualifiedName(name string) string {
	return parser.QualifiedName(Vendor, Class, name)
}

// NewSpec assembles a claim's spec: claim-wide edits (the environment,
// shared device nodes and mounts) and one device per allocated device. The
// version is the minimum the content requires.
func NewSpec(claimEdits cdispec.ContainerEdits, devices []cdispec.Device, annotations map[string]string) (*cdispec.Spec, error) {
	spec := &cdispec.Spec{
		Kind:           Vendor + "/" + Class,
		Annotations:    annotations,
		Devices:        devices,
		ContainerEdits: claimEdits,
	}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, err
	}
	spec.Version = v
	return spec, Validate(spec)
}

// Validate checks a spec as a container runtime would before using it.
func Validate(spec *cdispec.Spec) error {
	if err := cdispec.ValidateVersion(spec); err != nil {
		return fmt.Errorf("CDI spec version: %w", err)
	}
	vendor, class := parser.ParseQualifier(spec.Kind)
	if err := parser.ValidateVendorName(vendor); err != nil {
		return err
	}
	if err := parser.ValidateClassName(class); err != nil {
		return err
	}
	if err := (&cdi.ContainerEdits{ContainerEdits: &spec.ContainerEdits}).Validate(); err != nil {
		return fmt.Errorf("CDI spec edits: %w", err)
	}
	if len(spec.Devices) == 0 {
		return errors.New("CDI spec has no devices")
	}
	seen := map[string]bool{}
	for i := range spec.Devices {
		d := &spec.Devices[i]
		if err := parser.ValidateDeviceName(d.Name); err != nil {
			return err
		}
		if seen[d.Name] {
			return fmt.Errorf("CDI device %q is defined twice", d.Name)
		}
		seen[d.Name] = true
		e := d.ContainerEdits
		if len(e.Env) == 0 && len(e.DeviceNodes) == 0 && len(e.Mounts) == 0 && len(e.Hooks) == 0 {
			return fmt.Errorf("CDI device %q has no edits", d.Name)
		}
		if err := (&cdi.ContainerEdits{ContainerEdits: &d.ContainerEdits}).Validate(); err != nil {
			return fmt.Errorf("CDI device %q: %w", d.Name, err)
		}
	}
	return nil
}

// Dir is a CDI spec directory (--cdi-root).
type Dir struct {
	Path string
}

// Write validates and atomically writes a spec under name: a temporary
// file renamed into place, so a runtime never reads half a spec.
//
// It does not fsync. A transient spec only has to outlive a crash of the
// plugin, and the page cache keeps it across that; it need not outlive a
// crash of the node, after which the boot ID changes, the plugin drops
// every claim prepared before and the kubelet prepares them again. The
// checkpoint, which must survive, is fsynced.
func (d Dir) Write(name string, spec *cdispec.Spec) (err error) {
	if err := Validate(spec); err != nil {
		return err
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.Path, 0o755); err != nil {
		return fmt.Errorf("CDI spec directory: %w", err)
	}
	f, err := os.CreateTemp(d.Path, "."+name+".tmp-*")
	if err != nil {
		return fmt.Errorf("write CDI spec: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("write CDI spec: %w", err)
	}
	if err = f.Chmod(0o644); err != nil {
		_ = f.Close()
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(f.Name(), filepath.Join(d.Path, name)); err != nil {
		return fmt.Errorf("write CDI spec: %w", err)
	}
	return nil
}

// Read reads and validates a spec.
func (d Dir) Read(name string) (*cdispec.Spec, error) {
	data, err := os.ReadFile(filepath.Join(d.Path, name))
	if err != nil {
		return nil, err
	}
	spec, err := cdi.ParseSpec(data)
	if err != nil {
		return nil, err
	}
	if spec == nil {
		return nil, fmt.Errorf("CDI spec %s is empty", name)
	}
	return spec, Validate(spec)
}

// Exists says whether a spec file exists.
func (d Dir) Exists(name string) bool {
	_, err := os.Stat(filepath.Join(d.Path, name))
	return err == nil
}

// Remove deletes a spec; a missing one is not an error.
func (d Dir) Remove(name string) error {
	err := os.Remove(filepath.Join(d.Path, name))
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return fmt.Errorf("remove CDI spec: %w", err)
}

// RemoveTemporary removes temporary files that writes interrupted by a
// crash left behind.
func (d Dir) RemoveTemporary() error {
	matches, err := filepath.Glob(filepath.Join(d.Path, "."+cdi.GenerateTransientSpecName(Vendor, Class, "")+"*.tmp-*"))
	if err != nil {
		return err
	}
	for _, m := range matches {
		if err := os.Remove(m); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// ClaimUIDs lists the claims that have a Tessera spec in the directory.
func (d Dir) ClaimUIDs() ([]string, error) {
	entries, err := os.ReadDir(d.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if uid, ok := ClaimUIDFromSpecName(e.Name()); ok && e.Type().IsRegular() {
			out = append(out, uid)
		}
	}
	return out, nil
}
