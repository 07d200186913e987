package commands

import (
	"reflect"
	"testing"

	"github.com/tessera-dev/tessera/pkg/control/whatif"
)

func TestParseNodes(t *testing.T) {
	got, err := parseNodes("4xdgxh100,1xt4:2")
	if err != nil {
		t.Fatal(err)
	}
	want := []whatif.NodeGroup{{Count: 4, Profile: "dgxh100"}, {Count: 1, Profile: "t4:2"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseNodes = %+v, want %+v", got, want)
	}
	if _, err := parseNodes("four"); err == nil {
		t.Error("no error for a bad group")
	}
	if _, err := mockNodeSlices(t.Context(), "nosuchgpu", "n1"); err == nil {
		t.Error("no error for an unknown profile")
	}
}
