package featuregates

import (
	"os"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/test/testutil"

	"github.com/spf13/pflag"
	"k8s.io/component-base/featuregate"
)

// The stages and defaults are a contract with users and with
// docs/compatibility.md: a change here is a change of the table there.
func TestGateDefaults(t *testing.T) {
	for _, tc := range []struct {
		binary  string
		gates   []Gate
		feature featuregate.Feature
		stage   featuregate.FeatureSpec // PreRelease only
		on      bool
	}{
		{"kubelet-plugin", Plugin(), DynamicMIG, featuregate.FeatureSpec{PreRelease: featuregate.Beta}, true},
		{"kubelet-plugin", Plugin(), PerClaimMPS, featuregate.FeatureSpec{PreRelease: featuregate.Beta}, true},
		{"kubelet-plugin", Plugin(), MPSDaemonPods, featuregate.FeatureSpec{PreRelease: featuregate.Alpha}, false},
		{"controller", Controller(), TimeBasedFairShare, featuregate.FeatureSpec{PreRelease: featuregate.Alpha}, false},
		{"controller", Controller(), IdleReclaim, featuregate.FeatureSpec{PreRelease: featuregate.Alpha}, false},
		{"controller", Controller(), CanaryControllers, featuregate.FeatureSpec{PreRelease: featuregate.Alpha}, false},
		{"controller", Controller(), ShadowMode, featuregate.FeatureSpec{PreRelease: featuregate.Alpha}, false},
	} {
		t.Run(tc.binary+"/"+string(tc.feature), func(t *testing.T) {
			g := New(tc.gates)
			spec, ok := g.GetAll()[tc.feature]
			if !ok {
				t.Fatalf("%s does not know %s", tc.binary, tc.feature)
			}
			if spec.PreRelease != tc.stage.PreRelease || spec.Default != tc.on || g.Enabled(tc.feature) != tc.on || Enabled(nil, tc.gates, tc.feature) != tc.on {
				t.Errorf("%s: stage %q default %v enabled %v; want %q, %v", tc.feature, spec.PreRelease, spec.Default, g.Enabled(tc.feature), tc.stage.PreRelease, tc.on)
			}
			// Alpha off, beta on: the rule docs/compatibility.md states.
			if (spec.PreRelease == featuregate.Alpha) == spec.Default {
				t.Errorf("%s is %s with default %v", tc.feature, spec.PreRelease, spec.Default)
			}
		})
	}
	if n := len(Plugin()) + len(Controller()); n != 7 {
		t.Errorf("%d gates; the table above has 7: add the new gate to it and to docs/compatibility.md", n)
	}
}

func TestFlag(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		gates       []Gate
		want        map[featuregate.Feature]bool
		wantErr     string
	}{
		{"alpha on", "ShadowMode=true", Controller(), map[featuregate.Feature]bool{ShadowMode: true, IdleReclaim: false}, ""},
		{"beta off", "DynamicMIG=false,MPSDaemonPods=true", Plugin(), map[featuregate.Feature]bool{DynamicMIG: false, MPSDaemonPods: true, PerClaimMPS: true}, ""},
		{"the other binary's gate", "ShadowMode=true", Plugin(), nil, "unrecognized feature gate: ShadowMode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := New(tc.gates)
			fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
			g.AddFlag(fs)
			err := fs.Parse([]string{"--feature-gates=" + tc.value})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Parse: %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for f, on := range tc.want {
				if g.Enabled(f) != on {
					t.Errorf("%s = %v, want %v", f, g.Enabled(f), on)
				}
			}
		})
	}
}

func TestRequire(t *testing.T) {
	g := New(Controller())
	if err := Require(g, Controller(), ShadowMode, "--shadow"); err == nil || err.Error() != "--shadow needs --feature-gates=ShadowMode=true (the feature is alpha; see docs/compatibility.md#tesseras-feature-gates)" {
		t.Errorf("Require with the gate off: %v", err)
	}
	if err := g.Set("ShadowMode=true"); err != nil {
		t.Fatal(err)
	}
	if err := Require(g, Controller(), ShadowMode, "--shadow"); err != nil {
		t.Errorf("Require with the gate on: %v", err)
	}
}

// A promotion is a spec appended at the release that makes it: the gate
// keeps its old stage and default where that release is not reached.
func TestPromotionByVersion(t *testing.T) {
	gates := []Gate{{Name: "Example", Specs: featuregate.VersionedSpecs{alpha(v0_1), beta(version.MajorMinor(0, 2))}}}
	for _, tc := range []struct {
		at    *version.Version
		stage featuregate.FeatureSpec // PreRelease only
		on    bool
	}{
		{version.MajorMinor(0, 1), featuregate.FeatureSpec{PreRelease: featuregate.Alpha}, false},
		{version.MajorMinor(0, 2), featuregate.FeatureSpec{PreRelease: featuregate.Beta}, true},
		{version.MajorMinor(0, 3), featuregate.FeatureSpec{PreRelease: featuregate.Beta}, true},
	} {
		g := newAt(tc.at, gates)
		if spec := g.GetAll()["Example"]; spec.PreRelease != tc.stage.PreRelease || g.Enabled("Example") != tc.on {
			t.Errorf("at %s: %s, on %v; want %s, %v", tc.at, spec.PreRelease, g.Enabled("Example"), tc.stage.PreRelease, tc.on)
		}
	}
}

// Version is the chart's appVersion: a release that moves one moves the
// other, and with it every gate's stage.
func TestVersionIsTheChartsAppVersion(t *testing.T) {
	data, err := os.ReadFile(testutil.Path(t, "deployments", "helm", "tessera", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(data, &chart); err != nil {
		t.Fatal(err)
	}
	app, err := version.ParseSemantic(chart.AppVersion)
	if err != nil {
		t.Fatalf("appVersion %q: %v", chart.AppVersion, err)
	}
	if app.Major() != Version.Major() || app.Minor() != Version.Minor() {
		t.Errorf("featuregates.Version %s, chart appVersion %s", Version, app)
	}
	for _, g := range append(Plugin(), Controller()...) {
		for i, s := range g.Specs {
			if s.Version == nil || s.Version.GreaterThan(Version) || i > 0 && !g.Specs[i-1].Version.LessThan(s.Version) {
				t.Errorf("%s: spec %d at %v: specs must be oldest first, each at a release up to %s", g.Name, i, s.Version, Version)
			}
		}
	}
}
