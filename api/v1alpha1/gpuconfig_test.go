package v1alpha1

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestDecodeGpuConfig(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    *GpuConfig
		wantErr []string // substrings of the error
	}{
		{
			name: "all fields",
			in:   `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","enforcement":"mps","timeSliceInterval":"Long","frameworkCaps":["xla","pytorch"]}`,
			want: &GpuConfig{Enforcement: EnforcementMPS, TimeSliceInterval: TimeSliceLong, FrameworkCaps: []FrameworkCap{"xla", "pytorch"}},
		},
		{
			name: "empty config",
			in:   `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig"}`,
			want: &GpuConfig{},
		},
		{
			name: "explicitly no caps",
			in:   `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","frameworkCaps":[]}`,
			want: &GpuConfig{FrameworkCaps: []FrameworkCap{}},
		},
		{name: "unknown field", in: `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","enforcment":"mps"}`, wantErr: []string{`unknown field "enforcment"`, "enforcement, minEnforcement, timeSliceInterval, frameworkCaps"}},
		{name: "field case matters", in: `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","Enforcement":"mps"}`, wantErr: []string{`unknown field "Enforcement"`}},
		{name: "duplicate field", in: `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","enforcement":"mps","enforcement":"none"}`, wantErr: []string{`duplicate field "enforcement"`}},
		{name: "wrong apiVersion", in: `{"apiVersion":"gpu.nvidia.com/v1beta1","kind":"GpuConfig"}`, wantErr: []string{"apiVersion", `"tessera.dev/v1alpha1"`}},
		{name: "missing kind", in: `{"apiVersion":"tessera.dev/v1alpha1"}`, wantErr: []string{"kind", "(missing)", `"GpuConfig"`}},
		{name: "wrong type", in: `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","frameworkCaps":"pytorch"}`, wantErr: []string{"frameworkCaps"}},
		{name: "not an object", in: `[1,2]`, wantErr: []string{"JSON object"}},
		{name: "empty", in: ``, wantErr: []string{"JSON object"}},
		{name: "too big", in: `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","x":"` + strings.Repeat("a", MaxGpuConfigBytes) + `"}`, wantErr: []string{"bytes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeGpuConfig([]byte(tt.in))
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("want error, got %+v", got)
				}
				for _, s := range tt.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got.TypeMeta = tt.want.TypeMeta
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestValidateNamesFieldAndValues(t *testing.T) {
	tests := []struct {
		cfg  GpuConfig
		want []string
	}{
		{GpuConfig{Enforcement: "magic"}, []string{"enforcement", `"magic"`, `"none"`, `"interposer"`, `"mps"`, `"auto"`}},
		{GpuConfig{TimeSliceInterval: "short"}, []string{"timeSliceInterval", `"Default"`, `"Short"`, `"Medium"`, `"Long"`}},
		{GpuConfig{FrameworkCaps: []FrameworkCap{"pytorch", "tf"}}, []string{"frameworkCaps[1]", `"tf"`, `"pytorch"`, `"xla"`}},
		{GpuConfig{MinEnforcement: EnforcementAuto}, []string{"minEnforcement", `"auto"`, `"none"`, `"mps"`, `"interposer"`}},
		{GpuConfig{MinEnforcement: "hard"}, []string{"minEnforcement", `"hard"`}},
		{GpuConfig{MinEnforcement: EnforcementMPS}, nil},
		{GpuConfig{ComputeDefault: "fair"}, []string{"computeDefault", `"fair"`, `"proportional"`, `"uncapped"`}},
		{GpuConfig{ComputeDefault: ComputeUncapped}, nil},
		{GpuConfig{ComputeDefault: ComputeProportional}, nil},
		{GpuConfig{}, nil},
		{GpuConfig{Enforcement: EnforcementInterposer, TimeSliceInterval: TimeSliceMedium, FrameworkCaps: FrameworkCaps}, nil},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if tt.want == nil {
			if err != nil {
				t.Errorf("%+v: unexpected error %v", tt.cfg, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%+v: want error", tt.cfg)
			continue
		}
		for _, s := range tt.want {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%+v: error %q does not contain %q", tt.cfg, err, s)
			}
		}
	}
}

func TestMergeAndNormalize(t *testing.T) {
	class := &GpuConfig{Enforcement: EnforcementInterposer, FrameworkCaps: []FrameworkCap{FrameworkCapXLA}}
	claim := &GpuConfig{TimeSliceInterval: TimeSliceShort}
	request := &GpuConfig{Enforcement: EnforcementMPS, FrameworkCaps: []FrameworkCap{}}

	got := (*GpuConfig)(nil).Merge(class).Merge(claim)
	got.Normalize()
	if got.Enforcement != EnforcementInterposer || got.TimeSliceInterval != TimeSliceShort || !got.HasFrameworkCap(FrameworkCapXLA) {
		t.Errorf("class+claim: %+v", got)
	}
	got = got.Merge(request)
	got.Normalize()
	if got.Enforcement != EnforcementMPS || got.TimeSliceInterval != TimeSliceShort || len(got.FrameworkCaps) != 0 {
		t.Errorf("class+claim+request: %+v", got)
	}
	if class.Enforcement != EnforcementInterposer || len(class.FrameworkCaps) != 1 {
		t.Errorf("merge modified its input: %+v", class)
	}

	empty := &GpuConfig{}
	empty.Normalize()
	if empty.Enforcement != EnforcementAuto || empty.TimeSliceInterval != "" || empty.APIVersion != "tessera.dev/v1alpha1" {
		t.Errorf("defaults: %+v", empty)
	}
	dup := &GpuConfig{FrameworkCaps: []FrameworkCap{"xla", "pytorch", "xla"}}
	dup.Normalize()
	if !reflect.DeepEqual(dup.FrameworkCaps, []FrameworkCap{"pytorch", "xla"}) {
		t.Errorf("caps not sorted and de-duplicated: %v", dup.FrameworkCaps)
	}
}

func TestComputeDefaultDecodeMergeNormalize(t *testing.T) {
	tests := []struct {
		name    string
		configs []string
		want    ComputeDefault
	}{
		{"unset is uncapped", []string{`{}`}, ComputeUncapped},
		{"class proportional", []string{`{"computeDefault":"proportional"}`}, ComputeProportional},
		{"class uncapped", []string{`{"computeDefault":"uncapped"}`}, ComputeUncapped},
		{"later config wins", []string{`{"computeDefault":"uncapped"}`, `{"computeDefault":"proportional"}`}, ComputeProportional},
		{"unset later keeps earlier", []string{`{"computeDefault":"uncapped"}`, `{"enforcement":"mps"}`}, ComputeUncapped},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			merged := &GpuConfig{}
			for _, c := range tt.configs {
				raw := `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig",` + strings.TrimPrefix(c, "{")
				if c == `{}` {
					raw = `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig"}`
				}
				cfg, err := DecodeGpuConfig([]byte(raw))
				if err != nil {
					t.Fatalf("decode %s: %v", raw, err)
				}
				if err := cfg.Validate(); err != nil {
					t.Fatalf("validate %s: %v", raw, err)
				}
				merged = merged.Merge(cfg)
			}
			merged.Normalize()
			if merged.ComputeDefault != tt.want {
				t.Errorf("computeDefault = %q, want %q", merged.ComputeDefault, tt.want)
			}
		})
	}
	if _, err := DecodeGpuConfig([]byte(`{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","computeDefualt":"uncapped"}`)); err == nil || !strings.Contains(err.Error(), "computeDefault") {
		t.Errorf("misspelt field: error %v should list computeDefault among the known fields", err)
	}
}

func TestTimeSliceIntervalValue(t *testing.T) {
	for i, v := range TimeSliceIntervals {
		if v.Value() != i {
			t.Errorf("%s = %d, want %d", v, v.Value(), i)
		}
	}
	if TimeSliceInterval("").Value() != -1 {
		t.Error("unset interval must be -1")
	}
}

// FuzzDecodeConfig checks that decoding never panics and that whatever
// decodes and validates survives a round trip unchanged.
func FuzzDecodeConfig(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","enforcement":"mps","timeSliceInterval":"Long","frameworkCaps":["xla","pytorch"]}`))
	f.Add([]byte(`{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig"}`))
	f.Add([]byte(`{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","frameworkCaps":[]}`))
	f.Add([]byte(`{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","enforcement":"magic"}`))
	f.Add([]byte(`{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","x":1}`))
	f.Add([]byte(`{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","computeDefault":"uncapped"}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"apiVersion":1,"kind":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := DecodeGpuConfig(data)
		if err != nil {
			if cfg != nil {
				t.Fatalf("error %v with a result", err)
			}
			return
		}
		if cfg.APIVersion != GroupVersion.String() || cfg.Kind != GpuConfigKind {
			t.Fatalf("decoded %+v with wrong type meta", cfg)
		}
		if cfg.Validate() != nil {
			return
		}
		merged := (&GpuConfig{}).Merge(cfg)
		merged.Normalize()
		if err := merged.Validate(); err != nil {
			t.Fatalf("normalized config does not validate: %v", err)
		}
		again := merged.DeepCopy()
		again.Normalize()
		if !reflect.DeepEqual(again, merged) {
			t.Fatalf("normalize is not idempotent: %+v vs %+v", again, merged)
		}
		out, err := json.Marshal(merged)
		if err != nil {
			t.Fatal(err)
		}
		back, err := DecodeGpuConfig(out)
		if err != nil {
			t.Fatalf("re-decoding %s: %v", out, err)
		}
		back.Normalize()
		if len(back.FrameworkCaps) == 0 && len(merged.FrameworkCaps) == 0 {
			back.FrameworkCaps, merged.FrameworkCaps = nil, nil
		}
		if !reflect.DeepEqual(back, merged) {
			t.Fatalf("round trip changed %+v into %+v", merged, back)
		}
	})
}

func TestFloorOrderAndMerge(t *testing.T) {
	tests := []struct {
		a, b, want EnforcementMode
	}{
		{"", "", ""},
		{"", EnforcementNone, EnforcementNone},
		{EnforcementNone, EnforcementMPS, EnforcementMPS},
		{EnforcementMPS, EnforcementNone, EnforcementMPS},
		{EnforcementMPS, EnforcementInterposer, EnforcementInterposer},
		{EnforcementInterposer, EnforcementMPS, EnforcementInterposer},
		{EnforcementInterposer, "", EnforcementInterposer},
	}
	for _, tt := range tests {
		if got := MaxFloor(tt.a, tt.b); got != tt.want {
			t.Errorf("MaxFloor(%q, %q) = %q, want %q", tt.a, tt.b, got, tt.want)
		}
		// A later configuration never lowers the floor.
		got := (&GpuConfig{MinEnforcement: tt.a}).Merge(&GpuConfig{MinEnforcement: tt.b})
		if got.MinEnforcement != tt.want {
			t.Errorf("Merge(%q, %q).MinEnforcement = %q, want %q", tt.a, tt.b, got.MinEnforcement, tt.want)
		}
	}
	if FloorRank(EnforcementAuto) != -1 || FloorRank("x") != -1 {
		t.Error("auto and unknown values must not rank as floors")
	}
	if cfg, err := DecodeGpuConfig([]byte(`{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","minEnforcement":"interposer"}`)); err != nil || cfg.MinEnforcement != EnforcementInterposer {
		t.Errorf("decode minEnforcement: %+v %v", cfg, err)
	}
}
