// Package docsection keeps generated sections of a Markdown report between
// HTML comment markers, so that several generators can write one file
// (docs/benchmarks.md) without overwriting each other's parts.
package docsection

import (
	"os"
	"strings"
)

// Markers delimit one generated section. Begin and End are whole lines,
// usually HTML comments, that appear nowhere else in the document.
type Markers struct {
	Begin string
	End   string
}

// span returns where the section starts and where its end marker ends in
// doc; ok is false when doc has no complete section.
func (m Markers) span(doc string) (i, j int, ok bool) {
	i = strings.Index(doc, m.Begin)
	if i < 0 {
		return 0, 0, false
	}
	k := strings.Index(doc[i:], m.End)
	if k < 0 {
		return 0, 0, false
	}
	return i, i + k + len(m.End), true
}

// Splice replaces the section of doc with section (which carries its own
// markers), or appends section when doc has none.
func (m Markers) Splice(doc, section string) string {
	i, j, ok := m.span(doc)
	if !ok {
		return strings.TrimRight(doc, "\n") + "\n\n" + section
	}
	return doc[:i] + strings.TrimRight(section, "\n") + doc[j:]
}

// Kept is the section of the report at path, markers included and ending in
// a newline, to carry over into a regenerated report; "" when the file or
// the section is missing.
func (m Markers) Kept(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	doc := string(data)
	i, j, ok := m.span(doc)
	if !ok {
		return ""
	}
	return doc[i:j] + "\n"
}

// Write splices section into the report at path (creating it when missing).
func (m Markers) Write(path, section string) error {
	doc, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	return os.WriteFile(path, []byte(m.Splice(string(doc), section)), 0o644)
}

// The sections of docs/benchmarks.md that `make bench` does not write but
// keeps when it regenerates the report.
var (
	// BenchScale is written by `make bench-scale` (go run ./hack/bench --scale).
	BenchScale = Markers{
		Begin: "<!-- bench-scale:begin (written by make bench-scale; make bench keeps it) -->",
		End:   "<!-- bench-scale:end -->",
	}
	// BenchScaleLarge is written by `make bench-scale-large` (go run
	// ./hack/bench --scale --scale-size large): the run beyond 500 nodes.
	BenchScaleLarge = Markers{
		Begin: "<!-- bench-scale-large:begin (written by make bench-scale-large; make bench keeps it) -->",
		End:   "<!-- bench-scale-large:end -->",
	}
	// BenchUpstream is written by `make bench-upstream` (go run ./hack/benchupstream).
	BenchUpstream = Markers{
		Begin: "<!-- bench-upstream:start -->",
		End:   "<!-- bench-upstream:end -->",
	}
	// BenchTuning is written by `make bench-tuning` (go run ./hack/bench
	// --tuning) into docs/tuning.md.
	BenchTuning = Markers{
		Begin: "<!-- bench-tuning:begin (written by make bench-tuning) -->",
		End:   "<!-- bench-tuning:end -->",
	}
	// Kept lists the sections of docs/benchmarks.md in the order a regenerated report carries them.
	Kept = []Markers{BenchScale, BenchScaleLarge, BenchUpstream}
)
