package main

import "testing"

func TestParseBench(t *testing.T) {
	out := []byte(`goos: linux
BenchmarkPrepareLatency/share-2         	    2000	   1334422 ns/op	         0.940 prepare-p50-ms	         2.270 prepare-p99-ms
BenchmarkGang512-2   	       3	  81234567 ns/op	      1075 allocator-calls
BenchmarkBroken-2   	 FAIL
PASS
ok  	github.com/tessera-dev/tessera/pkg/node/plugin	12.3s
`)
	got := parseBench(out)
	tests := []struct {
		name, unit string
		want       float64
	}{
		{"PrepareLatency/share", "prepare-p99-ms", 2.27},
		{"PrepareLatency/share", "ns/op", 1334422},
		{"Gang512", "allocator-calls", 1075},
	}
	for _, tc := range tests {
		if v := got[tc.name].Figures[tc.unit]; v != tc.want {
			t.Errorf("%s %s = %v, want %v", tc.name, tc.unit, v, tc.want)
		}
	}
	if len(got) != 2 || got["Gang512"].N != 3 {
		t.Errorf("parsed %+v, want the two benchmark lines", got)
	}
}
