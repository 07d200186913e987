package docsection

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSplice(t *testing.T) {
	m := Markers{Begin: "<!-- x:begin -->", End: "<!-- x:end -->"}
	section := m.Begin + "\n## X\nfigures\n" + m.End + "\n"
	other := "<!-- y:begin -->\ny\n<!-- y:end -->"
	tests := []struct {
		name, doc, want string
	}{
		{"appended to a report without one", "# Benchmarks\n\nbody\n", "# Benchmarks\n\nbody\n\n" + section},
		{"replaces the old one in place", "# B\n\n" + m.Begin + "\nold\n" + m.End + "\n\n## After\n", "# B\n\n" + strings.TrimRight(section, "\n") + "\n\n## After\n"},
		{"an empty report", "", "\n\n" + section},
		{"another section stays", "# B\n\n" + other + "\n\n" + m.Begin + "\nold\n" + m.End + "\n", "# B\n\n" + other + "\n\n" + section},
		{"an end marker before the begin marker is not a section", m.End + "\n# B\n" + m.Begin + "\nold\n", m.End + "\n# B\n" + m.Begin + "\nold\n\n" + section},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := m.Splice(tc.doc, section); got != tc.want {
				t.Errorf("Splice() =\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

func TestKeptSurvivesARegeneratedReport(t *testing.T) {
	m := BenchUpstream
	section := m.Begin + "\n## Upstream\nfigures\n" + m.End + "\n"
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	if got := m.Kept(path); got != "" {
		t.Errorf("Kept of a missing report = %q, want nothing", got)
	}
	if err := os.WriteFile(path, []byte("# Benchmarks\nold body\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.Write(path, section); err != nil {
		t.Fatal(err)
	}
	if got := m.Kept(path); got != section {
		t.Errorf("Kept() = %q, want %q", got, section)
	}
	if got := BenchScale.Kept(path); got != "" {
		t.Errorf("BenchScale.Kept() = %q, want nothing: only the upstream section was written", got)
	}
}
