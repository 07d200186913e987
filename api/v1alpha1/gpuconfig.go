package v1alpha1

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"
)

// MaxGpuConfigBytes bounds an opaque configuration; the API server caps
// opaque parameters at 10 KiB too.
const MaxGpuConfigBytes = 10 * 1024

// gpuConfigFields are the fields a GpuConfig may have, for error messages.
var gpuConfigFields = []string{"apiVersion", "kind", "enforcement", "minEnforcement", "timeSliceInterval", "frameworkCaps", "computeDefault"}

// DecodeGpuConfig decodes opaque parameters strictly: the apiVersion must
// be tessera.dev/v1alpha1, the kind GpuConfig, and unknown or duplicate
// fields are rejected. The result is neither normalized nor validated.
func DecodeGpuConfig(data []byte) (*GpuConfig, error) {
	if len(data) > MaxGpuConfigBytes {
		return nil, fmt.Errorf("configuration is %d bytes, more than the %d allowed", len(data), MaxGpuConfigBytes)
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, fmt.Errorf("configuration must be a JSON object with apiVersion %s and kind %s", GroupVersion, GpuConfigKind)
	}
	var tm struct {
		APIVersion any `json:"apiVersion"`
		Kind       any `json:"kind"`
	}
	if err := json.Unmarshal(trimmed, &tm); err != nil {
		return nil, fmt.Errorf("configuration is not valid JSON: %w", err)
	}
	if tm.APIVersion != GroupVersion.String() {
		return nil, fmt.Errorf("apiVersion: unsupported value %s: use %q", describe(tm.APIVersion), GroupVersion.String())
	}
	if tm.Kind != GpuConfigKind {
		return nil, fmt.Errorf("kind: unsupported value %s: use %q", describe(tm.Kind), GpuConfigKind)
	}
	cfg := &GpuConfig{}
	strictErrs, err := kjson.UnmarshalStrict(trimmed, cfg)
	if err != nil {
		return nil, fmt.Errorf("configuration does not decode: %w (fields: %s)", err, strings.Join(gpuConfigFields, ", "))
	}
	if len(strictErrs) > 0 {
		msgs := make([]string, 0, len(strictErrs))
		for _, e := range strictErrs {
			msgs = append(msgs, e.Error())
		}
		return nil, fmt.Errorf("%s (known fields: %s)", strings.Join(msgs, "; "), strings.Join(gpuConfigFields, ", "))
	}
	return cfg, nil
}

func describe(v any) string {
	if v == nil {
		return "(missing)"
	}
	b, _ := json.Marshal(v)
	if len(b) > 64 {
		b = append(b[:61], "..."...)
	}
	return string(b)
}

// Normalize fills defaults (enforcement auto, computeDefault uncapped) and sorts and de-duplicates
// the framework caps. Apply it to the merged configuration, not to the
// ones merged, or defaults would override what an earlier one set.
func (c *GpuConfig) Normalize() {
	c.APIVersion = GroupVersion.String()
	c.Kind = GpuConfigKind
	if c.Enforcement == "" {
		c.Enforcement = EnforcementAuto
	}
	if c.ComputeDefault == "" {
		c.ComputeDefault = ComputeUncapped
	}
	if c.FrameworkCaps != nil {
		caps := slices.Clone(c.FrameworkCaps)
		slices.Sort(caps)
		c.FrameworkCaps = slices.Compact(caps)
	}
}

// Validate checks every set field; unset ones are fine. Errors name the
// field and the values it allows.
func (c *GpuConfig) Validate() error {
	var errs field.ErrorList
	if c.Enforcement != "" && !slices.Contains(EnforcementModes, c.Enforcement) {
		errs = append(errs, field.NotSupported(field.NewPath("enforcement"), c.Enforcement, EnforcementModes))
	}
	if c.MinEnforcement != "" && FloorRank(c.MinEnforcement) < 0 {
		errs = append(errs, field.NotSupported(field.NewPath("minEnforcement"), c.MinEnforcement, EnforcementFloors))
	}
	if c.TimeSliceInterval != "" && !slices.Contains(TimeSliceIntervals, c.TimeSliceInterval) {
		errs = append(errs, field.NotSupported(field.NewPath("timeSliceInterval"), c.TimeSliceInterval, TimeSliceIntervals))
	}
	if c.ComputeDefault != "" && !slices.Contains(ComputeDefaults, c.ComputeDefault) {
		errs = append(errs, field.NotSupported(field.NewPath("computeDefault"), c.ComputeDefault, ComputeDefaults))
	}
	for i, fc := range c.FrameworkCaps {
		if !slices.Contains(FrameworkCaps, fc) {
			errs = append(errs, field.NotSupported(field.NewPath("frameworkCaps").Index(i), fc, FrameworkCaps))
		}
	}
	return errs.ToAggregate()
}

// Merge returns c with the fields that override sets replaced: a later
// configuration wins field by field, except minEnforcement, where the
// stronger floor wins (a later configuration cannot lower it). Neither
// input is modified.
func (c *GpuConfig) Merge(override *GpuConfig) *GpuConfig {
	out := c.DeepCopy()
	if out == nil {
		out = &GpuConfig{}
	}
	if override == nil {
		return out
	}
	if override.Enforcement != "" {
		out.Enforcement = override.Enforcement
	}
	if override.MinEnforcement != "" {
		out.MinEnforcement = MaxFloor(out.MinEnforcement, override.MinEnforcement)
	}
	if override.TimeSliceInterval != "" {
		out.TimeSliceInterval = override.TimeSliceInterval
	}
	if override.FrameworkCaps != nil {
		out.FrameworkCaps = slices.Clone(override.FrameworkCaps)
	}
	if override.ComputeDefault != "" {
		out.ComputeDefault = override.ComputeDefault
	}
	return out
}

// HasFrameworkCap says whether the configuration opts in to a cap.
func (c *GpuConfig) HasFrameworkCap(fc FrameworkCap) bool {
	return slices.Contains(c.FrameworkCaps, fc)
}

// Value is the number nvidia-smi compute-policy --set-timeslice takes,
// -1 for an unset or unknown interval.
func (i TimeSliceInterval) Value() int {
	return slices.Index(TimeSliceIntervals, i)
}
