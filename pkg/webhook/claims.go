package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/dynamic-resource-allocation/cel"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/tessera-dev/tessera/pkg/demand"
)

// ClaimsPath is where the ClaimValidator is served.
const ClaimsPath = "/validate--v1-pod-claims"

// ClaimValidator refuses a pod with a container that uses two or more
// claims whose devices are the driver's: the limits the driver puts into a
// container's environment are per claim, and two claims' variables would
// collide (the last one wins, so one claim's limit would apply to the
// other's device). One claim with several requests is the way to give a
// container several devices. The check needs the claims, templates and
// device classes, which only a webhook can read; the webhook
// configurations send it only pods with a container naming two or more
// claims (a match condition), so it costs nothing to every other pod.
type ClaimValidator struct {
	Decoder admission.Decoder
	Reader  client.Reader
	// Driver is the DRA driver name (gpu.tessera.dev).
	Driver string
	// CEL caches the compiled selectors of device classes; nil compiles
	// them on every request.
	CEL *cel.Cache
}

// Handle implements admission.Handler.
func (v *ClaimValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	pod := &corev1.Pod{}
	if err := v.Decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	ours := map[string]bool{} // pod claim entry -> its devices are the driver's
	resolved := map[string]bool{}
	var ext *demand.ExtendedResources
	containers := append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...)
	for _, c := range containers {
		if len(c.Resources.Claims) == 0 {
			continue
		}
		var names []string
		for _, rc := range c.Resources.Claims {
			if !resolved[rc.Name] {
				is, err := v.usesDriver(ctx, pod, rc.Name)
				if err != nil {
					var denied *deniedError
					if errors.As(err, &denied) {
						return admission.Denied(denied.msg)
					}
					return admission.Errored(http.StatusInternalServerError, err)
				}
				ours[rc.Name], resolved[rc.Name] = is, true
			}
			if ours[rc.Name] && !contains(names, rc.Name) {
				names = append(names, rc.Name)
			}
		}
		if len(names) == 0 {
			continue
		}
		// The claim kube-scheduler makes for the container's extended
		// resources is one more claim in the container.
		if ext == nil {
			var err error
			if ext, err = extendedResources(ctx, v.Reader); err != nil {
				return admission.Errored(http.StatusInternalServerError, err)
			}
		}
		for _, name := range ext.ContainerExtendedResources(&c) {
			if v.classIsOurs(ctx, ext.Class(name)) {
				names = append(names, "extended resource "+string(name))
			}
		}
		if len(names) > 1 {
			sort.Strings(names)
			return admission.Denied(fmt.Sprintf("container %s uses %d claims with %s devices (%s): their limits would collide in the container's environment; use one claim with several requests instead (an extended resource counts as a claim of its own)",
				c.Name, len(names), v.Driver, strings.Join(names, ", ")))
		}
	}
	return admission.Allowed("")
}

// classIsOurs says whether the class selects the driver's devices (a class
// whose selectors do not decide on the driver is not counted: the webhook
// has no published devices to try them on).
func (v *ClaimValidator) classIsOurs(ctx context.Context, dc *resourceapi.DeviceClass) bool {
	cache := v.CEL
	if cache == nil {
		cache = cel.NewCache(10, cel.Features{})
	}
	selects, _ := demand.ClassSelectsDriver(ctx, cache, dc, v.Driver)
	return selects
}

type deniedError struct{ msg string }

func (e *deniedError) Error() string { return e.msg }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// usesDriver says whether the pod's claim entry asks for a device of a
// class that selects the driver. A claim or template that does not exist
// yet cannot be checked: the pod is refused (create the claims first), so
// that it cannot be swapped in after the check.
func (v *ClaimValidator) usesDriver(ctx context.Context, pod *corev1.Pod, entry string) (bool, error) {
	var spec *resourceapi.ResourceClaimSpec
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.Name != entry {
			continue
		}
		switch {
		case rc.ResourceClaimName != nil:
			var claim resourceapi.ResourceClaim
			if err := v.Reader.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: *rc.ResourceClaimName}, &claim); err != nil {
				if apierrors.IsNotFound(err) {
					return false, &deniedError{fmt.Sprintf("claim %s: ResourceClaim %s does not exist: create the claims before a pod whose container uses several of them", entry, *rc.ResourceClaimName)}
				}
				return false, err
			}
			spec = &claim.Spec
		case rc.ResourceClaimTemplateName != nil:
			var tmpl resourceapi.ResourceClaimTemplate
			if err := v.Reader.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: *rc.ResourceClaimTemplateName}, &tmpl); err != nil {
				if apierrors.IsNotFound(err) {
					return false, &deniedError{fmt.Sprintf("claim %s: ResourceClaimTemplate %s does not exist: create the templates before a pod whose container uses several claims", entry, *rc.ResourceClaimTemplateName)}
				}
				return false, err
			}
			spec = &tmpl.Spec.Spec
		}
	}
	if spec == nil {
		return false, nil // the API server refuses an unknown entry
	}
	for _, r := range spec.Devices.Requests {
		var classes []string
		if r.Exactly != nil {
			classes = append(classes, r.Exactly.DeviceClassName)
		}
		for _, s := range r.FirstAvailable {
			classes = append(classes, s.DeviceClassName)
		}
		for _, name := range classes {
			var dc resourceapi.DeviceClass
			if err := v.Reader.Get(ctx, client.ObjectKey{Name: name}, &dc); err != nil {
				if apierrors.IsNotFound(err) {
					return false, &deniedError{fmt.Sprintf("claim %s: DeviceClass %s does not exist", entry, name)}
				}
				return false, err
			}
			if v.classIsOurs(ctx, &dc) {
				return true, nil
			}
		}
	}
	return false, nil
}
