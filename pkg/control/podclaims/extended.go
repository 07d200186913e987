package podclaims

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ExtendedClaimEntry is the key suffix of the claim kube-scheduler makes for
// a pod's extended resources backed by DRA ("pod:<uid>/<entry>"): one claim
// per pod, whatever its containers ask. It cannot clash with a
// spec.resourceClaims entry, whose names are DNS labels.
const ExtendedClaimEntry = "<extended-resources>"

// ExtendedResources resolves extended resource names to the DeviceClasses
// that serve them through DRA (DRAExtendedResource, GA in Kubernetes 1.37),
// as kube-scheduler does: the implicit name
// deviceclass.resource.kubernetes.io/<class> names that class; a class's
// spec.extendedResourceName names it too, the newest class winning when
// several name the same resource (the lower name on a tie). The zero value
// resolves only nothing; build it with NewExtendedResources from the live
// classes.
type ExtendedResources struct {
	byName map[corev1.ResourceName]*resourceapi.DeviceClass
}

// NewExtendedResources indexes the classes' extended resource names.
func NewExtendedResources(classes []*resourceapi.DeviceClass) *ExtendedResources {
	e := &ExtendedResources{byName: make(map[corev1.ResourceName]*resourceapi.DeviceClass, 2*len(classes))}
	for _, dc := range classes {
		e.byName[corev1.ResourceName(resourceapi.ResourceDeviceClassPrefix+dc.Name)] = dc
	}
	for _, dc := range classes {
		if dc.Spec.ExtendedResourceName == nil {
			continue
		}
		name := corev1.ResourceName(*dc.Spec.ExtendedResourceName)
		if cur := e.byName[name]; cur != nil && !newerClass(dc, cur) {
			continue
		}
		e.byName[name] = dc
	}
	return e
}

// newerClass says whether a wins over b for one extended resource name.
func newerClass(a, b *resourceapi.DeviceClass) bool {
	ta, tb := a.CreationTimestamp.UnixNano(), b.CreationTimestamp.UnixNano()
	if ta != tb {
		return ta > tb
	}
	return a.Name < b.Name
}

// Class is the DeviceClass that serves the extended resource name through
// DRA, nil when none does (then a device plugin may serve it).
func (e *ExtendedResources) Class(name corev1.ResourceName) *resourceapi.DeviceClass {
	if e == nil || !IsDRAExtendedResourceName(name) {
		return nil
	}
	return e.byName[name]
}

// IsDRAExtendedResourceName says whether a resource name may be served by a
// DeviceClass: an extended resource name (a domain other than
// kubernetes.io) or the implicit deviceclass.resource.kubernetes.io/<class>.
func IsDRAExtendedResourceName(name corev1.ResourceName) bool {
	s := string(name)
	if strings.HasPrefix(s, resourceapi.ResourceDeviceClassPrefix) {
		return true
	}
	domain, _, ok := strings.Cut(s, "/")
	if !ok || strings.HasPrefix(s, corev1.DefaultResourceRequestsPrefix) {
		return false
	}
	return domain != "kubernetes.io" && !strings.HasSuffix(domain, ".kubernetes.io")
}

// ContainerExtendedResources lists the names in a container's requests and
// limits that a DeviceClass serves (for the API, an extended resource's
// request equals its limit; a limit alone implies the request).
func (e *ExtendedResources) ContainerExtendedResources(c *corev1.Container) []corev1.ResourceName {
	var out []corev1.ResourceName
	add := func(l corev1.ResourceList) {
		for name, q := range l {
			if !q.IsZero() && e.Class(name) != nil && !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	add(c.Resources.Requests)
	add(c.Resources.Limits)
	slices.Sort(out)
	return out
}

// PodExtendedResources lists the names a DeviceClass serves in any of the
// pod's containers and init containers.
func (e *ExtendedResources) PodExtendedResources(pod *corev1.Pod) []corev1.ResourceName {
	var out []corev1.ResourceName
	for _, c := range allContainers(pod) {
		for _, name := range e.ContainerExtendedResources(&c) {
			if !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	slices.Sort(out)
	return out
}

// allContainers are the init containers, then the containers: the indexes
// kube-scheduler names requests by.
func allContainers(pod *corev1.Pod) []corev1.Container {
	return append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...)
}

// ExtendedClaimSpec is the claim kube-scheduler makes for the pod's
// extended resources served by DRA, as it makes it on a node that serves
// none of them through a device plugin (Tessera pins such pods to one):
// for each resource, one request per long-lived container (regular
// containers and sidecars) named container-<index>-request-<index of the
// resource among the container's sorted requests>, ExactCount of what the
// container asks; init containers that run to completion reuse the
// requests of the containers after them and ask only what those lack, the
// largest of them once. nil when the pod asks for none.
func (e *ExtendedResources) ExtendedClaimSpec(pod *corev1.Pod) *resourceapi.ResourceClaimSpec {
	names := e.PodExtendedResources(pod)
	if len(names) == 0 {
		return nil
	}
	containers := allContainers(pod)
	inits := len(pod.Spec.InitContainers)
	var reqs []resourceapi.DeviceRequest
	for _, name := range names {
		class := e.Class(name).Name
		long := make([]*resourceapi.DeviceRequest, len(containers))
		for i := range containers {
			if i < inits && !isSidecar(&containers[i]) {
				continue
			}
			long[i] = containerRequest(i, &containers[i], name, class, nil)
		}
		var maxShort *resourceapi.DeviceRequest
		for i := 0; i < inits; i++ {
			if isSidecar(&containers[i]) {
				continue
			}
			if r := containerRequest(i, &containers[i], name, class, long[i:]); r != nil && (maxShort == nil || r.Exactly.Count > maxShort.Exactly.Count) {
				maxShort = r
			}
		}
		if maxShort != nil {
			reqs = append(reqs, *maxShort)
		}
		for _, r := range long {
			if r != nil {
				reqs = append(reqs, *r)
			}
		}
	}
	if len(reqs) == 0 {
		return nil
	}
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].Name < reqs[j].Name })
	return &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}}
}

func isSidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// containerRequest is the request container i adds for resource name: what
// it asks beyond the reusable requests of the containers after it, nil when
// it asks nothing more.
func containerRequest(i int, c *corev1.Container, name corev1.ResourceName, class string, reusable []*resourceapi.DeviceRequest) *resourceapi.DeviceRequest {
	asked := containerQuantity(c, name)
	if asked <= 0 {
		return nil
	}
	for _, r := range reusable {
		if r != nil {
			asked -= r.Exactly.Count
			if asked <= 0 {
				return nil
			}
		}
	}
	keys := make([]string, 0, len(c.Resources.Requests)+1)
	for k := range c.Resources.Requests {
		keys = append(keys, string(k))
	}
	if _, ok := c.Resources.Requests[name]; !ok {
		// A limit alone: the API server defaults the request to it.
		for k := range c.Resources.Limits {
			if _, dup := c.Resources.Requests[k]; !dup {
				keys = append(keys, string(k))
			}
		}
	}
	slices.Sort(keys)
	idx := slices.Index(keys, string(name))
	return &resourceapi.DeviceRequest{
		Name: fmt.Sprintf("container-%d-request-%d", i, idx),
		Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: class,
			AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
			Count:           asked,
		},
	}
}

// containerQuantity is what a container asks of an extended resource: its
// request, else its limit.
func containerQuantity(c *corev1.Container, name corev1.ResourceName) int64 {
	q, ok := c.Resources.Requests[name]
	if !ok {
		q, ok = c.Resources.Limits[name]
	}
	if !ok {
		return 0
	}
	n, ok := q.AsInt64()
	if !ok {
		return 0
	}
	return n
}

// extendedClaim resolves the claim of a pod's extended resources: the one
// kube-scheduler made (recorded in the pod's status) when it exists, else
// the one it will make. ok is false when the pod asks for none.
func extendedClaim(pod *corev1.Pod, objs Objects, ext *ExtendedResources) (PodClaim, bool) {
	key := "pod:" + string(pod.UID) + "/" + ExtendedClaimEntry
	if st := pod.Status.ExtendedResourceClaimStatus; st != nil && st.ResourceClaimName != "" {
		if claim := objs.Claim(pod.Namespace, st.ResourceClaimName); claim != nil {
			return PodClaim{Key: key, Display: claim.Name, Claim: claim, Exists: true}, true
		}
	}
	spec := ext.ExtendedClaimSpec(pod)
	if spec == nil {
		return PodClaim{}, false
	}
	claim := &resourceapi.ResourceClaim{Spec: *spec}
	claim.Namespace = pod.Namespace
	claim.Name = pod.Name + "-extended-resources"
	claim.UID = types.UID("tessera-sim-" + string(pod.UID) + "-extended-resources")
	names := ext.PodExtendedResources(pod)
	list := make([]string, len(names))
	for i, n := range names {
		list[i] = string(n)
	}
	return PodClaim{Key: key, Display: claim.Name + " (for extended resources " + strings.Join(list, ", ") + ")", Claim: claim}, true
}
