package plugin

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/tessera-dev/tessera/pkg/node/nvmlsource"
)

func TestPrintSlicesIsAResourceSliceStream(t *testing.T) {
	for _, tc := range []struct {
		profile, mig string
		timeSlices   int
		wantSlices   int
		wantDevices  int
	}{
		{profile: "t4", mig: "none", wantSlices: 1, wantDevices: 1},
		{profile: "t4:2", mig: "none", timeSlices: 4, wantSlices: 2, wantDevices: 10},
		{profile: "dgxh100", mig: "all", wantSlices: 5, wantDevices: 200},
	} {
		t.Run(tc.profile, func(t *testing.T) {
			o := &Options{NodeName: "n1", ReservedMemory: "256Mi", MIGMode: "dynamic", TimeSlices: tc.timeSlices,
				Backend: nvmlsource.Options{Kind: nvmlsource.Mock, MockProfile: tc.profile, MockMIG: tc.mig}}
			var out bytes.Buffer
			if err := PrintSlices(context.Background(), o, &out); err != nil {
				t.Fatal(err)
			}
			dec := utilyaml.NewYAMLOrJSONDecoder(&out, 4096)
			slices, devices := 0, 0
			for {
				var s resourceapi.ResourceSlice
				if err := dec.Decode(&s); err == io.EOF {
					break
				} else if err != nil {
					t.Fatal(err)
				}
				if s.Kind != "ResourceSlice" || s.APIVersion != "resource.k8s.io/v1" || s.Spec.Driver != "gpu.tessera.dev" || *s.Spec.NodeName != "n1" || s.Spec.Pool.Name != "n1" {
					t.Fatalf("unexpected slice header: %+v", s.TypeMeta)
				}
				slices++
				devices += len(s.Spec.Devices)
			}
			if slices != tc.wantSlices || devices != tc.wantDevices {
				t.Fatalf("%d slices with %d devices, want %d with %d", slices, devices, tc.wantSlices, tc.wantDevices)
			}
		})
	}
}

func TestPrintSlicesRejectsBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"unknown profile", Options{Backend: nvmlsource.Options{Kind: nvmlsource.Mock, MockProfile: "t9"}}, `unknown mock GPU model "t9"`},
		{"bad backend", Options{Backend: nvmlsource.Options{Kind: "cuda"}}, `--gpu-backend="cuda" is not valid`},
		{"no NVML", Options{Backend: nvmlsource.Options{Kind: nvmlsource.NVML}}, "libnvidia-ml.so.1) could not be loaded"},
		{"MIG on a T4", Options{Backend: nvmlsource.Options{Kind: nvmlsource.Mock, MockProfile: "t4", MockMIG: "all"}}, "--mock-mig=all: none of the GPUs"},
		{"bad reserve", Options{ReservedMemory: "lots", Backend: nvmlsource.Options{Kind: nvmlsource.Mock, MockProfile: "t4"}}, `--reserved-memory="lots" is not a valid memory size`},
		{"time slices out of range", Options{TimeSlices: 40, Backend: nvmlsource.Options{Kind: nvmlsource.Mock, MockProfile: "t4"}}, "--time-slices=40 is out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.o.ReservedMemory == "" {
				tc.o.ReservedMemory = "256Mi"
			}
			if tc.o.MIGMode == "" {
				tc.o.MIGMode = "dynamic"
			}
			err := PrintSlices(context.Background(), &tc.o, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}
