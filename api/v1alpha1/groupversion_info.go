// Package v1alpha1 holds Tessera's API types of group tessera.dev, version
// v1alpha1: the Queue CRD the controller serves and the opaque GPU
// configuration carried in DeviceClasses and ResourceClaims.
//
// +kubebuilder:object:generate=true
// +groupName=tessera.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of these types.
	GroupVersion = schema.GroupVersion{Group: "tessera.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
