// Package v1alpha1 holds Tessera's API types of group tessera.dev, version
// v1alpha1: the Queue CRD the controller serves and the opaque GPU
// configuration carried in DeviceClasses and ResourceClaims.
//
// +kubebuilder:object:generate=true
// +groupName=tessera.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of these types.
	GroupVersion = schema.GroupVersion{Group: "tessera.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// addKnownTypes registers the Queue kinds; GpuConfig and DeviceStatus
// are opaque JSON inside Kubernetes objects, decoded by the driver.
func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Queue{}, &QueueList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
