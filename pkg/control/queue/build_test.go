package queue

import (
	"testing"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

func TestMemoryQueue(t *testing.T) {
	for _, tc := range []struct {
		quota, limit string
		resources    bool
		wantQ, wantL string
	}{
		{"", "", false, "", ""},
		{"8Gi", "", true, "8Gi", ""},
		{"", "16Gi", true, "", "16Gi"},
		{"8Gi", "16Gi", true, "8Gi", "16Gi"},
	} {
		q := MemoryQueue("team", "dept", tc.quota, tc.limit)
		if q.Name != "team" || q.Spec.Parent != "dept" {
			t.Errorf("%q/%q: name %q parent %q", tc.quota, tc.limit, q.Name, q.Spec.Parent)
		}
		r, ok := q.Spec.Resources[v1alpha1.ResourceGPUMemory]
		if ok != tc.resources || len(q.Spec.Resources) > 1 {
			t.Errorf("%q/%q: resources %v", tc.quota, tc.limit, q.Spec.Resources)
			continue
		}
		str := func(p interface{ String() string }, set bool) string {
			if !set {
				return ""
			}
			return p.String()
		}
		if got := str(r.Quota, r.Quota != nil); got != tc.wantQ {
			t.Errorf("%q/%q: quota %q", tc.quota, tc.limit, got)
		}
		if got := str(r.Limit, r.Limit != nil); got != tc.wantL {
			t.Errorf("%q/%q: limit %q", tc.quota, tc.limit, got)
		}
	}
}
