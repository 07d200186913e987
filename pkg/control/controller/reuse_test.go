package controller

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestReuseKeepsUnchangedObjects(t *testing.T) {
	slice := func(uid, rv string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: uid, UID: types.UID(uid), ResourceVersion: rv}}
	}
	first, prev := reuse(nil, []*resourceapi.ResourceSlice{slice("a", "1"), slice("b", "1"), slice("c", "")})
	tests := []struct {
		name string
		item *resourceapi.ResourceSlice
		same bool
	}{
		{"unchanged", slice("a", "1"), true},
		{"new resourceVersion", slice("b", "2"), false},
		{"no resourceVersion", slice("c", ""), false},
		{"new object", slice("d", "1"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, next := reuse(prev, []*resourceapi.ResourceSlice{tt.item})
			same := false
			for _, p := range first {
				same = same || p == got[0]
			}
			if same != tt.same {
				t.Errorf("previous pointer kept: %v, want %v", same, tt.same)
			}
			if next[tt.item.UID] != got[0] {
				t.Errorf("the next map does not hold the returned pointer")
			}
			if got[0].ResourceVersion != tt.item.ResourceVersion {
				t.Errorf("resourceVersion %q, want %q", got[0].ResourceVersion, tt.item.ResourceVersion)
			}
		})
	}
}
