package scale

import (
	"context"
	"strings"
	"testing"

	tesserav1 "github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/node/plugin"
)

// TestMIGSlices checks what the MIG workload republishes: an 8 x H100
// node in dynamic MIG mode publishes about 200 devices with shared
// counters, and the workload's claim gets a 1g.10gb partition from them
// through mig.tessera.dev with the scheduler's allocator; the ordinary
// slices have no MIG device.
func TestMIGSlices(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name            string
		mig             bool
		minDev, maxDev  int
		counters, fitsM bool
	}{
		{"ordinary", false, 8, 40, false, false},
		{"dynamic MIG", true, 150, 260, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts, err := pluginOptions("dgxh100", tc.mig)
			if err != nil {
				t.Fatal(err)
			}
			slices, err := plugin.NodeSlices(ctx, opts, "kwok-node-0000")
			if err != nil {
				t.Fatal(err)
			}
			devices, counters := 0, false
			for _, s := range slices {
				devices += len(s.Spec.Devices)
				counters = counters || len(s.Spec.SharedCounters) > 0
			}
			if devices < tc.minDev || devices > tc.maxDev || counters != tc.counters {
				t.Errorf("%d devices, shared counters %v; want %d to %d, %v", devices, counters, tc.minDev, tc.maxDev, tc.counters)
			}
			cl := decidetest.Claim("ns", "c")
			cl.Spec = migClaimTemplate().Spec.Spec
			res, err := allocation.NewAllocator(slices, decidetest.Classes()).Allocate(ctx, decidetest.Node("kwok-node-0000"), allocation.NewState(), cl)
			if fits := err == nil && len(res) == 1; fits != tc.fitsM {
				t.Fatalf("MIG claim allocated: %v (%v), want %v", fits, err, tc.fitsM)
			}
			if tc.fitsM && !strings.Contains(res[0].Devices.Results[0].Device, "-mig-") {
				t.Errorf("MIG claim got device %s, not a partition", res[0].Devices.Results[0].Device)
			}
		})
	}
}

// TestMIGWorkloads checks the two workloads: sized by MIGPods (none at
// 0), queued over the share queues, the baseline with the share template
// and no setup, the MIG one with the MIG template and the republish.
func TestMIGWorkloads(t *testing.T) {
	if got := migWorkloads(Config{Queues: 2}); len(got) != 0 {
		t.Errorf("MIGPods 0: %d workloads, want none", len(got))
	}
	cfg := Small()
	ws := migWorkloads(cfg)
	if len(ws) != 2 || ws[0].name != MIGSharesName || ws[1].name != MIGName {
		t.Fatalf("workloads %v", ws)
	}
	for _, tc := range []struct {
		w        workload
		template string
		setup    bool
	}{{ws[0], shareTemplate, false}, {ws[1], migTemplate, true}} {
		p := basePod("ns", 5)
		tc.w.pod(5, p)
		if tc.w.pods != cfg.MIGPods || p.Labels[tesserav1.QueueLabel] != leafQueue(5%cfg.Queues) ||
			len(p.Spec.ResourceClaims) != 1 || *p.Spec.ResourceClaims[0].ResourceClaimTemplateName != tc.template ||
			len(p.Spec.Containers[0].Resources.Claims) != 1 || (tc.w.setup != nil) != tc.setup {
			t.Errorf("%s: %d pods, pod %+v, setup %v", tc.w.name, tc.w.pods, p.Spec.ResourceClaims, tc.w.setup != nil)
		}
	}
	// Both run after the other workloads.
	all := workloads(cfg)
	if all[len(all)-1].name != MIGName {
		t.Errorf("last workload %s, want %s", all[len(all)-1].name, MIGName)
	}
}

// TestWorkloadsOfEachSize checks which workloads each size measures: the
// large run only (b), (a') and (a), on 2,000 nodes that hold its pods.
func TestWorkloadsOfEachSize(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"small", Small(), []string{"plain", "claims", "shares", "shares-nopin", "ungated", "gangs", "gang", MIGSharesName, MIGName}},
		{"full", Default(), []string{"plain", "claims", "shares", "shares-nopin", "ungated", "gangs", "gang", MIGSharesName, MIGName}},
		{"large", Large(), []string{"plain", "claims", "shares"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, w := range workloads(tc.cfg) {
				got = append(got, w.name)
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("workloads %v, want %v", got, tc.want)
			}
			if err := tc.cfg.Validate(8); err != nil {
				t.Error(err)
			}
		})
	}
	if l := Large(); l.Nodes != 2000 || l.Pods != Default().Pods || !l.NoPeer {
		t.Errorf("Large() = %+v: want 2,000 nodes, the full run's pods, no peer", l)
	}
}
