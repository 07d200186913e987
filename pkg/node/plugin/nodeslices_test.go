package plugin_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/spf13/pflag"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/nodeslices"
	"github.com/tessera-dev/tessera/pkg/node/plugin"
)

// What-if's added nodes, the simulator's and the engine's test nodes are
// nodeslices.MockProfile's: exactly what the plugin publishes with
// --gpu-backend=mock and its default flags.
func TestMockProfileIsThePlugins(t *testing.T) {
	ctx := context.Background()
	for _, profile := range []string{"h100-80gb:1", "t4:2", "dgxh100"} {
		got, err := nodeslices.MockProfile(ctx, profile, "n1")
		if err != nil {
			t.Fatal(err)
		}
		o := &plugin.Options{}
		fs := pflag.NewFlagSet("p", pflag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse([]string{"--gpu-backend=mock", "--mock-profile=" + profile}); err != nil {
			t.Fatal(err)
		}
		want, err := plugin.NodeSlices(ctx, o, "n1")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.Slices, want) {
			t.Errorf("%s: slices differ from the plugin's", profile)
		}
		cfg, err := o.DeviceModelConfig()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(cfg, devicemodel.DefaultConfig()) {
			t.Errorf("the plugin's default flags make %+v, devicemodel.DefaultConfig() is %+v", cfg, devicemodel.DefaultConfig())
		}
	}
}
