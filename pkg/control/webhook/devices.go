package webhook

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/pkg/control/podclaims"
)

// extendedResourceCEL says, in a match condition, that container c asks for
// a resource that a DeviceClass may serve through DRA: a name with a domain
// other than kubernetes.io, or deviceclass.resource.kubernetes.io/<class>
// (extended resources are always in limits). It over-approximates (a
// device plugin's resource matches too); the webhook decides with the live
// DeviceClasses.
const extendedResourceCEL = "has(c.resources) && has(c.resources.limits) && c.resources.limits.exists(k, k.contains('/') && !k.startsWith('kubernetes.io/'))"

// Match conditions of the pod webhooks (the Helm chart repeats them; test/helm
// checks that it does).
const (
	// UsesDevicesExpression: the pod uses a ResourceClaim, or a container
	// asks for an extended resource a DeviceClass may serve.
	UsesDevicesExpression = "(has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0) || " +
		"object.spec.containers.exists(c, " + extendedResourceCEL + ") || " +
		"(has(object.spec.initContainers) && object.spec.initContainers.exists(c, " + extendedResourceCEL + "))"
	// SeveralDevicesExpression: a container or init container names two or
	// more claims, a claim's request, or a claim and an extended resource a
	// DeviceClass may serve (the claim kube-scheduler makes for it is a
	// second claim); or two containers ask for extended resources (one
	// claim split between them).
	SeveralDevicesExpression = "(has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0 && " +
		"(object.spec.containers.exists(c, " + severalCEL + ") || " +
		"(has(object.spec.initContainers) && object.spec.initContainers.exists(c, " + severalCEL + ")))) || " +
		"size((has(object.spec.initContainers) ? object.spec.initContainers : []).filter(c, " + extendedResourceCEL + ")) + " +
		"size(object.spec.containers.filter(c, " + extendedResourceCEL + ")) > 1"
	severalCEL = "has(c.resources) && has(c.resources.claims) && (size(c.resources.claims) > 1 || " +
		"c.resources.claims.exists(r, has(r.request)) || " +
		"(size(c.resources.claims) > 0 && " + extendedResourceCEL + "))"
)

// extendedResources resolves extended resource names with the live
// DeviceClasses (an administrator's objects: the cache is safe to read,
// see CacheFirst).
func extendedResources(ctx context.Context, r client.Reader) (*podclaims.ExtendedResources, error) {
	var list resourceapi.DeviceClassList
	if err := r.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing DeviceClasses: %w", err)
	}
	classes := make([]*resourceapi.DeviceClass, len(list.Items))
	for i := range list.Items {
		classes[i] = &list.Items[i]
	}
	return podclaims.NewExtendedResources(classes), nil
}

// usesDevices says whether the pod gets devices through DRA: it uses a
// ResourceClaim, or a container asks for an extended resource that a
// DeviceClass serves now, or the implicit
// deviceclass.resource.kubernetes.io/<class> of any class (one created
// later would serve it). It returns the extended resources it asks.
func usesDevices(pod *corev1.Pod, ext *podclaims.ExtendedResources) (bool, []corev1.ResourceName) {
	var names []corev1.ResourceName
	for _, c := range append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		for name := range c.Resources.Limits {
			if strings.HasPrefix(string(name), resourceapi.ResourceDeviceClassPrefix) || ext.Class(name) != nil {
				names = append(names, name)
			}
		}
	}
	return len(pod.Spec.ResourceClaims) > 0 || len(names) > 0, names
}
