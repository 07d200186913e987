package main

import (
	"context"
	"testing"

	"github.com/tessera-dev/tessera/pkg/node/nvmlsource"
	"github.com/tessera-dev/tessera/pkg/node/plugin"
)

// TestSmokeOnMockGPUs runs the smoke path without a GPU: discovery, the
// real prepare of a share, a whole GPU and a MIG partition, unprepare and
// the leftover check, on mock GPUs (the probe is not run).
func TestSmokeOnMockGPUs(t *testing.T) {
	o := &plugin.Options{
		NodeName:       "smoke",
		Backend:        nvmlsource.Options{Kind: nvmlsource.Mock, MockProfile: "t4:1,a100-40gb", MockMIG: "all"},
		ReservedMemory: "256Mi",
		MIGMode:        "dynamic",
		NvidiaSMI:      "nvidia-smi",
	}
	if err := run(context.Background(), o, t.TempDir(), "cc", "", "runc", true); err != nil {
		t.Fatal(err)
	}
}
