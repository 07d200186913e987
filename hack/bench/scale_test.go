package main

import (
	"testing"
)

func TestShortFunc(t *testing.T) {
	for in, want := range map[string]string{
		"k8s.io/dynamic-resource-allocation/structured/internal/experimental.(*Allocator).Allocate": "experimental.(*Allocator).Allocate",
		"runtime.mallocgc":                    "runtime.mallocgc",
		"encoding/json.(*decodeState).object": "json.(*decodeState).object",
		"k8s.io/api/core/v1.(*Pod).Unmarshal": "v1.(*Pod).Unmarshal",
		"main.main.func1":                     "main.main.func1",
	} {
		if got := shortFunc(in); got != want {
			t.Errorf("shortFunc(%q) = %q, want %q", in, got, want)
		}
	}
}
