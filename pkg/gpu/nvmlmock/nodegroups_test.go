package nvmlmock

import (
	"reflect"
	"testing"
)

func TestParseNodeGroups(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []NodeGroup
	}{
		{"2xdgxh100", []NodeGroup{{2, "dgxh100"}}},
		{"2xdgxh100; 25xt4:4", []NodeGroup{{2, "dgxh100"}, {25, "t4:4"}}},
		{"", nil}, {"x", nil}, {"0xt4", nil}, {"3xt9", nil}, {"threext4", nil},
	} {
		got, err := ParseNodeGroups(tc.in)
		if (err != nil) != (tc.want == nil) || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseNodeGroups(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}
