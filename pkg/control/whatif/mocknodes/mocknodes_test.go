package mocknodes_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/spf13/pflag"

	"github.com/tessera-dev/tessera/pkg/control/whatif"
	"github.com/tessera-dev/tessera/pkg/control/whatif/mocknodes"
	"github.com/tessera-dev/tessera/pkg/node/plugin"
)

func TestParseNodes(t *testing.T) {
	got, err := mocknodes.ParseNodes("4xdgxh100,1xt4:2")
	if err != nil {
		t.Fatal(err)
	}
	want := []whatif.NodeGroup{{Count: 4, Profile: "dgxh100"}, {Count: 1, Profile: "t4:2"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseNodes = %+v, want %+v", got, want)
	}
	if _, err := mocknodes.ParseNodes("four"); err == nil {
		t.Error("no error for a bad group")
	}
}

// The added nodes publish exactly what the plugin publishes.
func TestNodeSlicesAreThePlugins(t *testing.T) {
	ctx := context.Background()
	got, err := mocknodes.NodeSlices(ctx, "h100-80gb:1", "n1")
	if err != nil {
		t.Fatal(err)
	}
	o := &plugin.Options{}
	fs := pflag.NewFlagSet("p", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--gpu-backend=mock", "--mock-profile=h100-80gb:1"}); err != nil {
		t.Fatal(err)
	}
	want, err := plugin.NodeSlices(ctx, o, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("slices differ from the plugin's")
	}
	if _, err := mocknodes.NodeSlices(ctx, "nosuchgpu", "n1"); err == nil {
		t.Error("no error for an unknown profile")
	}
}
