package webhook

// The managed template a translated request becomes, and how the
// translation describes itself on the pod.

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// template builds the managed template for one container's request. It
// only ever names Tessera's GPU or time-slice class, in the pod's own
// namespace, without adminAccess, and a configuration a claim may carry
// itself (enforcement only).
func (c TranslateConfig) template(r *containerRequest, selectors []string, cfg *v1alpha1.GpuConfig) (*resourceapi.ResourceClaimTemplate, error) {
	class := c.GPUClass
	if r.timeSlc {
		class = c.TimeSliceClass
	}
	req := resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: r.count}
	if !r.wholeGPU && !r.timeSlc {
		caps := map[resourceapi.QualifiedName]resource.Quantity{}
		if r.memMiB > 0 {
			caps["memory"] = *resource.NewQuantity(r.memMiB<<20, resource.BinarySI)
		}
		if r.cores > 0 {
			caps["cores"] = *resource.NewQuantity(r.cores, resource.DecimalSI)
		}
		req.Capacity = &resourceapi.CapacityRequirements{Requests: caps}
	}
	for _, s := range selectors {
		req.Selectors = append(req.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	spec := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}}}}
	if r.count > 1 && !r.timeSlc {
		// Shares of distinct GPUs: a share's device is its GPU, which one
		// request could otherwise be given twice.
		spec.Devices.Constraints = []resourceapi.DeviceConstraint{{DistinctAttribute: ptr.To(resourceapi.FullyQualifiedName(c.Driver + "/uuid"))}}
	}
	if cfg != nil {
		raw, err := json.Marshal(struct {
			APIVersion  string                   `json:"apiVersion"`
			Kind        string                   `json:"kind"`
			Enforcement v1alpha1.EnforcementMode `json:"enforcement"`
		}{v1alpha1.GroupVersion.String(), v1alpha1.GpuConfigKind, cfg.Enforcement})
		if err != nil {
			return nil, err
		}
		spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{Requests: []string{"gpu"},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: c.Driver, Parameters: runtime.RawExtension{Raw: raw}}}}}
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{
			Name:        ManagedTemplatePrefix + hex.EncodeToString(sum[:])[:16],
			Labels:      map[string]string{ManagedTemplateLabel: ManagedTemplateValue},
			Annotations: map[string]string{TranslatedAnnotation: describe(r, c)},
		},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: spec},
	}, nil
}

// describe says what a request became.
func describe(r *containerRequest, c TranslateConfig) string {
	n := r.count
	plural := func(s string) string {
		if n == 1 {
			return s
		}
		return s + "s"
	}
	switch {
	case r.timeSlc:
		return fmt.Sprintf("%d %s of %s", n, plural("time slice"), c.TimeSliceClass)
	case r.wholeGPU:
		return fmt.Sprintf("%d whole %s of %s", n, plural("GPU"), c.GPUClass)
	}
	var caps []string
	if r.memMiB > 0 {
		caps = append(caps, fmt.Sprintf("memory %dMi", r.memMiB))
	}
	if r.cores > 0 {
		caps = append(caps, fmt.Sprintf("cores %d", r.cores))
	} else {
		caps = append(caps, "compute uncapped")
	}
	each := ""
	if n > 1 {
		each = " each, on distinct GPUs"
	}
	return fmt.Sprintf("%d %s of %s (%s%s)", n, plural("share"), c.GPUClass, strings.Join(caps, ", "), each)
}
