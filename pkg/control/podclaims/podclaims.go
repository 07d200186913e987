// Package podclaims is the one definition of which devices a pod gets: the
// claims it names, the claims made from its templates, and the claim
// kube-scheduler makes for the extended resources it asks that a
// DeviceClass serves. The controller's admission, charges and idle reclaim
// and the webhooks read it.
package podclaims

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Objects looks up claims and templates by namespace and name, and the
// DeviceClasses that serve extended resources.
type Objects interface {
	Claim(namespace, name string) *resourceapi.ResourceClaim
	Template(namespace, name string) *resourceapi.ResourceClaimTemplate
	// ExtendedResources resolves extended resource names to classes (nil:
	// none is served through DRA).
	ExtendedResources() *ExtendedResources
}

// PodClaim is one claim a pod uses.
type PodClaim struct {
	// Key identifies the claim for charging once: "claim:<ns>/<name>" for a
	// claim the pod names (possibly shared), "pod:<uid>/<entry>" for the
	// claim generated from a template for this pod.
	Key string
	// Display names the claim in messages.
	Display string
	// Claim is the ResourceClaim: the real one when it exists, else one made
	// from the template the way the resourceclaim controller will make it.
	Claim *resourceapi.ResourceClaim
	// Exists says whether Claim is a real object.
	Exists bool
}

// Allocated says whether the scheduler allocated the claim.
func (c *PodClaim) Allocated() bool { return c.Exists && c.Claim.Status.Allocation != nil }

// PodClaims resolves every claim through which a pod gets devices: the
// entries of spec.resourceClaims (claims it names, claims made from its
// templates) and the claim kube-scheduler makes for the extended resources
// it asks that a DeviceClass serves (DRAExtendedResource: the implicit
// deviceclass.resource.kubernetes.io/<class> and any class's
// extendedResourceName), found through status.extendedResourceClaimStatus
// once made. This is the one definition of what a pod gets: admission,
// charges, the two-claim rule and idle reclaim all read it. It fails with
// a plain error when something is not there yet (a claim or template to
// wait for).
func PodClaims(pod *corev1.Pod, objs Objects) ([]PodClaim, error) {
	out := make([]PodClaim, 0, len(pod.Spec.ResourceClaims)+1)
	for _, rc := range pod.Spec.ResourceClaims {
		switch {
		case rc.ResourceClaimName != nil:
			name := *rc.ResourceClaimName
			claim := objs.Claim(pod.Namespace, name)
			if claim == nil {
				return nil, fmt.Errorf("pod %s/%s: ResourceClaim %s does not exist (yet)", pod.Namespace, pod.Name, name)
			}
			out = append(out, PodClaim{Key: "claim:" + pod.Namespace + "/" + name, Display: name, Claim: claim, Exists: true})
		case rc.ResourceClaimTemplateName != nil:
			key := "pod:" + string(pod.UID) + "/" + rc.Name
			if gen := generatedName(pod, rc.Name); gen != "" {
				if claim := objs.Claim(pod.Namespace, gen); claim != nil {
					out = append(out, PodClaim{Key: key, Display: gen, Claim: claim, Exists: true})
					continue
				}
			}
			tmpl := objs.Template(pod.Namespace, *rc.ResourceClaimTemplateName)
			if tmpl == nil {
				return nil, fmt.Errorf("pod %s/%s: ResourceClaimTemplate %s does not exist (yet)", pod.Namespace, pod.Name, *rc.ResourceClaimTemplateName)
			}
			claim := &resourceapi.ResourceClaim{Spec: tmpl.Spec.Spec}
			claim.Namespace = pod.Namespace
			claim.Name = pod.Name + "-" + rc.Name
			claim.UID = types.UID("tessera-sim-" + string(pod.UID) + "-" + rc.Name)
			out = append(out, PodClaim{Key: key, Display: claim.Name + " (from template " + tmpl.Name + ")", Claim: claim})
		}
	}
	if pc, ok := extendedClaim(pod, objs, objs.ExtendedResources()); ok {
		out = append(out, pc)
	}
	return out, nil
}

func generatedName(pod *corev1.Pod, entry string) string {
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.Name == entry && s.ResourceClaimName != nil {
			return *s.ResourceClaimName
		}
	}
	return ""
}
