package v1alpha1

import "strings"

// TranslatedAnnotation records on a pod that Tessera's translating webhook
// turned another system's GPU keys (NVIDIA device plugin, HAMi, KAI) into
// claims, and what became what: "from <systems>; <what>; ..." with
// <systems> among device-plugin, hami, kai joined by "+". Only the webhook
// writes it (docs/migration.md).
const TranslatedAnnotation = "tessera.dev/translated"

// TranslatedFrom returns the systems a TranslatedAnnotation value names
// ("kai", "hami+kai"), or "" when it names none.
func TranslatedFrom(value string) string {
	rest, ok := strings.CutPrefix(value, "from ")
	if !ok {
		return ""
	}
	from, _, _ := strings.Cut(rest, ";")
	return strings.TrimSpace(from)
}
