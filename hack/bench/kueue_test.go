package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/test/scale"
)

func TestWritePeer(t *testing.T) {
	rep := &scale.Report{
		Runs: []*scale.Result{
			{Name: "ungated", Pods: 512, APIWrites: 4096},
			{Name: "queued-whole", Pods: 512, AllBound: 20 * time.Second, APIWrites: 5120,
				Usage: map[string]scale.Usage{"controller": {CPU: 512 * time.Millisecond, PeakRSS: 100 << 20}}},
			{Name: "kueue-whole", Pods: 512, AllBound: 40 * time.Second, APIWrites: 7680,
				Usage: map[string]scale.Usage{"kueue": {CPU: 1024 * time.Millisecond, PeakRSS: 200 << 20}}},
		},
		Shares: &scale.ShareAdmission{GPUs: 8, Pods: 88, Share: "8Gi", Tessera: 80, Kueue: 8},
	}
	var b strings.Builder
	writePeer(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, rep)
	out := b.String()
	for _, want := range []string{
		"| Tessera's controller (e') | 20.0 s | 25.6 | 10.00 | 2.00 | 1.00 ms | 100 MiB |",
		"| Kueue v0.17.0 (e) | 40.0 s | 12.8 | 15.00 | 7.00 | 2.00 ms | 200 MiB |",
		"**Tessera 80, Kueue 8**",
		"88 pods each",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("peer section lacks %q:\n%s", want, out)
		}
	}
	what, a, base := peerRatio(scale.Small())
	if a != "kueue-whole" || base != "queued-whole" || !strings.Contains(what, "64 whole-GPU pods") {
		t.Errorf("peerRatio = %q, %q, %q", what, a, base)
	}
	b.Reset()
	writePeer(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, &scale.Report{})
	if b.Len() != 0 {
		t.Errorf("a run without the peer wrote %q", b.String())
	}
}
