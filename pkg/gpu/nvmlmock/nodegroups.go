package nvmlmock

import (
	"fmt"
	"strconv"
	"strings"
)

// NodeGroup is Count nodes with the mock profile Profile.
type NodeGroup struct {
	Count   int
	Profile string
}

// ParseNodeGroups parses "<count>x<profile>" groups separated by ";", e.g.
// "10xdgxh100;25xt4:4" (the simulator's --nodes and what-if's --add-nodes).
func ParseNodeGroups(s string) ([]NodeGroup, error) {
	var out []NodeGroup
	for _, part := range strings.Split(s, ";") {
		countStr, profile, ok := strings.Cut(strings.TrimSpace(part), "x")
		n, err := strconv.Atoi(countStr)
		if !ok || err != nil || n < 1 {
			return nil, fmt.Errorf("node group %q: use <count>x<profile>, e.g. 10xdgxh100", part)
		}
		if _, err := ParseProfile(profile); err != nil {
			return nil, fmt.Errorf("node group %q: %w", part, err)
		}
		out = append(out, NodeGroup{Count: n, Profile: profile})
	}
	return out, nil
}
