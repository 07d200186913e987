package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/dynamic-resource-allocation/cel"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/tessera-dev/tessera/pkg/control/catalog"
)

// ClaimsPath is where the ClaimValidator is served.
const ClaimsPath = "/validate--v1-pod-claims"

// ClaimValidator refuses a pod with a container that holds two or more
// claims whose devices are the driver's, however asked (the claim
// kube-scheduler makes for a container's extended resources counts): the
// limits the driver puts into a container's environment are per claim, and
// two claims' variables would collide (the last one wins, so one claim's
// limit would apply to the other's device). One claim with several
// requests is the way to give a container several devices. For the same
// reason a claim of the driver's is not split by request between
// containers (each would get the claim's env for devices it does not
// hold), which for extended resources means one container asks them. The
// check needs the claims, templates and device classes, which only a
// webhook can read; the webhook configurations send it only the pods a
// match condition (SeveralDevicesExpression) picks, so it costs nothing to
// every other pod.
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
	msg, err := v.check(ctx, pod)
	var denied *deniedError
	switch {
	case errors.As(err, &denied):
		return admission.Denied(denied.msg)
	case err != nil:
		return admission.Errored(http.StatusInternalServerError, err)
	case msg != "":
		return admission.Denied(msg)
	}
	return admission.Allowed("")
}

// check returns why the pod is refused, or "". The enforcement env of a
// claim is the claim's: every container given any of its devices gets the
// limits of all of them, indexed in the claim's order. So a container may
// hold one Tessera claim at most (however asked), and a Tessera claim is
// given whole to the containers that use it, never split by request
// between them (each would be indexed as if it held the other's devices).
func (v *ClaimValidator) check(ctx context.Context, pod *corev1.Pod) (string, error) {
	ours := map[string]bool{} // pod claim entry -> its devices are the driver's
	resolved := map[string]bool{}
	isOurs := func(entry string) (bool, error) {
		if !resolved[entry] {
			is, err := v.usesDriver(ctx, pod, entry)
			if err != nil {
				return false, err
			}
			ours[entry], resolved[entry] = is, true
		}
		return ours[entry], nil
	}
	ext, err := extendedResources(ctx, v.Reader)
	if err != nil {
		return "", err
	}
	containers := append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...)
	// views[entry][container] is what part of a Tessera claim a container
	// is given ("" = all of it).
	views := map[string]map[string]string{}
	var extUsers []string
	// asks is what the containers ask of Tessera's extended resources.
	asks := map[string]corev1.ResourceList{}
	for i, c := range containers {
		var names []string
		for _, rc := range c.Resources.Claims {
			is, err := isOurs(rc.Name)
			if err != nil {
				return "", err
			}
			if !is {
				continue
			}
			if !contains(names, rc.Name) {
				names = append(names, rc.Name)
			}
			if views[rc.Name] == nil {
				views[rc.Name] = map[string]string{}
			}
			if old, seen := views[rc.Name][c.Name]; !seen || (old != "" && rc.Request != "") {
				views[rc.Name][c.Name] = joinView(old, rc.Request, seen)
			} else {
				views[rc.Name][c.Name] = ""
			}
		}
		var tessera []string
		for _, name := range ext.ContainerExtendedResources(&c) {
			if v.classIsOurs(ctx, ext.Class(name)) {
				tessera = append(tessera, string(name))
			}
		}
		if len(tessera) > 0 {
			asks[c.Name] = corev1.ResourceList{}
			for _, name := range tessera {
				asks[c.Name][corev1.ResourceName(name)] = c.Resources.Limits[corev1.ResourceName(name)]
			}
			names = append(names, "extended resource "+strings.Join(tessera, ", "))
			if i >= len(pod.Spec.InitContainers) || isSidecar(&c) {
				extUsers = append(extUsers, c.Name)
			}
		}
		if len(names) > 1 {
			sort.Strings(names)
			return fmt.Sprintf("container %s uses %d claims with %s devices (%s): their limits would collide in the container's environment; use one claim with several requests instead (an extended resource counts as a claim of its own)",
				c.Name, len(names), v.Driver, strings.Join(names, ", ")), nil
		}
	}
	// Init containers that run to completion reuse the requests of the
	// container after them; one that asks more gets a request of its own.
	for _, c := range pod.Spec.InitContainers {
		if isSidecar(&c) || asks[c.Name] == nil || contains(extUsers, c.Name) {
			continue
		}
		for name, q := range asks[c.Name] {
			if len(extUsers) == 0 {
				break
			}
			if main := asks[extUsers[0]][name]; q.Cmp(main) > 0 {
				extUsers = append(extUsers, c.Name)
				break
			}
		}
	}
	if len(extUsers) > 1 {
		return fmt.Sprintf("containers %s ask for %s devices through extended resources: kube-scheduler makes one claim for the pod, whose enforcement env every one of them would get; ask in one container, or give each container its own ResourceClaimTemplate",
			strings.Join(extUsers, ", "), v.Driver), nil
	}
	for _, entry := range sortedKeys(views) {
		byView := map[string][]string{}
		for ctr, view := range views[entry] {
			byView[view] = append(byView[view], ctr)
		}
		if len(byView) > 1 {
			var parts []string
			for _, view := range sortedKeys(byView) {
				ctrs := byView[view]
				sort.Strings(ctrs)
				what := "all of it"
				if view != "" {
					what = "requests " + view
				}
				parts = append(parts, strings.Join(ctrs, ", ")+" ("+what+")")
			}
			return fmt.Sprintf("claim %s with %s devices is split between containers: %s; its enforcement env is the claim's, so each would get the others' limits: give each container its own claim, or the whole claim",
				entry, v.Driver, strings.Join(parts, "; ")), nil
		}
	}
	return "", nil
}

// joinView adds request (a claim reference's request, "" for the whole
// claim) to a container's view of a claim.
func joinView(old, request string, seen bool) string {
	if !seen {
		return request
	}
	parts := append(strings.Split(old, ","), request)
	sort.Strings(parts)
	return strings.Join(slices.Compact(parts), ",")
}

func isSidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// classIsOurs says whether the class selects the driver's devices (a class
// whose selectors do not decide on the driver is not counted: the webhook
// has no published devices to try them on).
func (v *ClaimValidator) classIsOurs(ctx context.Context, dc *resourceapi.DeviceClass) bool {
	cache := v.CEL
	if cache == nil {
		cache = cel.NewCache(10, cel.Features{})
	}
	selects, _ := catalog.ClassSelectsDriver(ctx, cache, dc, v.Driver)
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
