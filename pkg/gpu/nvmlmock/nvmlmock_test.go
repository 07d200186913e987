package nvmlmock

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestParseProfile(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []string
		wantErr string
	}{
		{in: "t4", want: []string{"t4"}},
		{in: "t4:2,a10", want: []string{"t4", "t4", "a10"}},
		{in: "dgxh100", want: strings.Split(strings.Repeat("h100-80gb,", 8), ",")[:8]},
		{in: "T4:1", want: []string{"t4"}},
		{in: "t5", wantErr: `unknown mock GPU model "t5"`},
		{in: "t4:0", wantErr: "must be a positive integer"},
		{in: "t4:x", wantErr: "must be a positive integer"},
		{in: "", wantErr: "--mock-profile is empty"},
		{in: "t4:65", wantErr: "at most 64"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			spec, err := ParseProfile(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := spec.Models(); strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("models %v, want %v", got, tc.want)
			}
		})
	}
}

func newH100(t *testing.T, state string) (*Server, *Device) {
	t.Helper()
	spec, _ := ParseProfile("h100-80gb")
	srv, err := New(Options{Spec: spec, Seed: "n", MIGEnabled: true, StatePath: state})
	if err != nil {
		t.Fatal(err)
	}
	return srv, srv.Devices()[0]
}

func createGI(d *Device, profile int, start, size uint32) (nvml.GpuInstance, nvml.Return) {
	info, ret := d.GetGpuInstanceProfileInfo(profile)
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	return d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: start, Size: size})
}

func TestMIGPlacementRules(t *testing.T) {
	_, d := newH100(t, "")
	if _, ret := createGI(d, nvml.GPU_INSTANCE_PROFILE_4_SLICE, 0, 4); ret != nvml.SUCCESS {
		t.Fatalf("4g at 0: %v", ret)
	}
	for _, tc := range []struct {
		name        string
		profile     int
		start, size uint32
		want        nvml.Return
	}{
		{"overlap", nvml.GPU_INSTANCE_PROFILE_1_SLICE, 3, 1, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"not a placement", nvml.GPU_INSTANCE_PROFILE_3_SLICE, 2, 4, nvml.ERROR_INVALID_ARGUMENT},
		{"unknown profile", nvml.GPU_INSTANCE_PROFILE_6_SLICE, 0, 6, nvml.ERROR_NOT_SUPPORTED},
		{"fits", nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4, 4, nvml.SUCCESS},
	} {
		if _, ret := createGI(d, tc.profile, tc.start, tc.size); ret != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, nvml.ErrorString(ret), nvml.ErrorString(tc.want))
		}
	}
	_, d2 := newH100(t, "")
	if _, ret := createGI(d2, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 0, 1); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := createGI(d2, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 1); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Fatalf("second +me instance: %v", ret)
	}
}

func TestMIGStateSurvivesRestart(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	_, d := newH100(t, state)
	gi, ret := createGI(d, nvml.GPU_INSTANCE_PROFILE_2_SLICE, 2, 2)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ciInfo, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	mig, _ := d.GetMigDeviceHandleByIndex(0)
	uuid, _ := mig.GetUUID()

	_, d2 := newH100(t, state)
	mig2, ret := d2.GetMigDeviceHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatalf("MIG device lost across restart: %v", ret)
	}
	if u, _ := mig2.GetUUID(); u != uuid {
		t.Fatalf("MIG UUID changed across restart: %s != %s", u, uuid)
	}
	giID, _ := mig2.GetGpuInstanceId()
	gi2, _ := d2.GetGpuInstanceById(giID)
	if ret := gi2.Destroy(); ret != nvml.ERROR_IN_USE {
		t.Fatalf("destroying a GI with a CI: %v, want In Use", ret)
	}
	ciID, _ := mig2.GetComputeInstanceId()
	ci, _ := gi2.GetComputeInstanceById(ciID)
	if ci.Destroy() != nvml.SUCCESS || gi2.Destroy() != nvml.SUCCESS {
		t.Fatal("destroy failed")
	}
	_, d3 := newH100(t, state)
	if _, ret := d3.GetMigDeviceHandleByIndex(0); ret != nvml.ERROR_NOT_FOUND {
		t.Fatalf("destroyed instance came back: %v", ret)
	}
}
