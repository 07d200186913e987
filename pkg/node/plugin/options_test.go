package plugin

import (
	"strings"
	"testing"
	"time"

	"k8s.io/component-base/featuregate"

	"github.com/tessera-dev/tessera/pkg/featuregates"
)

// gates returns the plugin's gates set as --feature-gates=value would.
func gates(t *testing.T, value string) featuregate.FeatureGate {
	t.Helper()
	g := featuregates.New(featuregates.Plugin())
	if err := g.Set(value); err != nil {
		t.Fatal(err)
	}
	return g
}

func TestDynamicMIGGate(t *testing.T) {
	for _, tc := range []struct {
		name, mode, gate, want string
	}{
		{"dynamic, gate at its default (on)", "dynamic", "", ""},
		{"dynamic, gate off", "dynamic", "DynamicMIG=false", "--mig-mode=dynamic (the default; --mig-mode=static does not) needs --feature-gates=DynamicMIG=true"},
		{"static, gate off", "static", "DynamicMIG=false", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{ReservedMemory: "256Mi", MIGMode: tc.mode}
			if tc.gate != "" {
				o.Gates = gates(t, tc.gate)
			}
			_, err := o.DeviceModelConfig()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("DeviceModelConfig: %v, want %q", err, tc.want)
			}
		})
	}
}

func TestValidateDriverFlags(t *testing.T) {
	base := func() Options {
		return Options{NodeName: "n", CDIRoot: "/var/run/cdi", PluginDataDir: "/p", RescanInterval: time.Minute, DevRoot: "/"}
	}
	for _, tc := range []struct {
		name string
		set  func(*Options)
		want string
	}{
		{"defaults", func(*Options) {}, ""},
		{"operator driver root", func(o *Options) { o.DriverRoot, o.ContainerDriverRoot = "/run/nvidia/driver", "/driver-root" }, ""},
		{"relative driver root", func(o *Options) { o.DriverRoot = "run/nvidia/driver" }, "--driver-root"},
		{"relative dev root", func(o *Options) { o.DevRoot = "dev" }, "--dev-root"},
		{"relative container dev root", func(o *Options) { o.ContainerDevRoot = "host" }, "--container-dev-root"},
		{"relative hook", func(o *Options) { o.NvidiaCDIHookPath = "nvidia-cdi-hook" }, "--nvidia-cdi-hook-path"},
		{"container root without host root", func(o *Options) { o.ContainerDriverRoot = "/driver-root" }, "needs --driver-root"},
		{"mps daemons in process", func(o *Options) { o.MPSControl, o.MPSMode = "fake", MPSInProcess }, ""},
		{"mps daemon pods", func(o *Options) {
			o.Gates = gates(t, "MPSDaemonPods=true")
			o.MPSControl, o.MPSMode, o.MPSDaemonNamespace, o.MPSDaemonImage, o.MPSDaemonPullPolicy = "fake", MPSPod, "tessera-system", "tessera:dev", "Never"
		}, ""},
		{"mps daemon pods, gate at its default (off)", func(o *Options) {
			o.MPSControl, o.MPSMode, o.MPSDaemonNamespace, o.MPSDaemonImage, o.MPSDaemonPullPolicy = "fake", MPSPod, "tessera-system", "tessera:dev", "Never"
		}, "--mps-mode=pod needs --feature-gates=MPSDaemonPods=true (the feature is alpha"},
		{"per-claim mps, gate off", func(o *Options) {
			o.Gates = gates(t, "PerClaimMPS=false")
			o.MPSControl = "fake"
		}, "--mps-control needs --feature-gates=PerClaimMPS=true (the feature is beta"},
		{"unknown mps mode", func(o *Options) { o.MPSMode = "sidecar" }, "--mps-mode=sidecar"},
		{"mps daemon pods without control", func(o *Options) { o.Gates, o.MPSMode = gates(t, "MPSDaemonPods=true"), MPSPod }, "needs --mps-control"},
		{"mps daemon pods without image", func(o *Options) {
			o.Gates = gates(t, "MPSDaemonPods=true")
			o.MPSControl, o.MPSMode, o.MPSDaemonNamespace = "fake", MPSPod, "ns"
		}, "--mps-daemon-image"},
		{"mps daemon pods, bad pull policy", func(o *Options) {
			o.Gates = gates(t, "MPSDaemonPods=true")
			o.MPSControl, o.MPSMode, o.MPSDaemonNamespace, o.MPSDaemonImage, o.MPSDaemonPullPolicy = "fake", MPSPod, "ns", "i", "Sometimes"
		}, "--mps-daemon-image-pull-policy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base()
			tc.set(&o)
			err := o.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want an error naming %s", err, tc.want)
			}
		})
	}
}
