package main

import (
	"os"
	"strings"
)

// splice replaces the section of doc between the markers begin and end
// (both included) with section, or appends section when doc has none.
func splice(doc, begin, end, section string) string {
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		return strings.TrimRight(doc, "\n") + "\n\n" + section
	}
	return doc[:i] + strings.TrimRight(section, "\n") + doc[j+len(end):]
}

// writeSection splices section into the document at path (splice) and
// writes it back; a missing document is created.
func writeSection(path, begin, end, section string) error {
	doc, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	return os.WriteFile(path, []byte(splice(string(doc), begin, end, section)), 0o644)
}
