// Package deployments carries the manifests users install, embedded so that
// tests and tools use exactly the shipped files.
package deployments

import (
	"bytes"
	_ "embed"
	"errors"
	"io"

	resourceapi "k8s.io/api/resource/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// DeviceClassesYAML is deviceclasses.yaml.
//
//go:embed deviceclasses.yaml
var DeviceClassesYAML []byte

// DeviceClasses decodes the shipped DeviceClasses.
func DeviceClasses() ([]*resourceapi.DeviceClass, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(DeviceClassesYAML), 4096)
	var out []*resourceapi.DeviceClass
	for {
		var dc resourceapi.DeviceClass
		err := dec.Decode(&dc)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, &dc)
	}
}
