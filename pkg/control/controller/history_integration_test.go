package controller_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/history"
	"github.com/tessera-dev/tessera/test/testutil"
)

// TestHistoryAcrossRestartAndLeaderChange, against a real kube-apiserver:
// a queue's pod holds a 12Gi share of an H100 throughout; the usage
// history (status.usage, updated every second) goes on across a
// controller restart (down for 3 s) and a leader change to a second
// replica. While the claim is held, lastUpdated - total/12Gi (the
// moment the integration implies the claim was first seen) must not
// move: the gaps are integrated at the recorded rate, nothing is counted
// twice and nothing starts over. Since stays; the decayed amount stays
// below the total; `kubectl get queues -o wide` (the API server's table)
// shows the decayed history.
func TestHistoryAcrossRestartAndLeaderChange(t *testing.T) {
	e := startEnv(t)
	e.opts.UsageHistoryInterval = time.Second
	e.opts.UsageHalfLife = time.Hour
	e.opts.UsageMaxGap = time.Minute
	e.opts.UsageHistoryDays = 2
	slices := e.gpuNode("node-1", "dgxh100")
	e.create(decidetest.Queue("team", "", "", ""))
	e.startController()

	e.create(claim("h12", decidetest.Request{Memory: "12Gi"}))
	e.create(asNew(claimPod("h1", "team", "h12")))
	e.waitAdmitted("h1")
	e.allocate("node-1", slices, "h12")
	var c resourceapi.ResourceClaim
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: "default", Name: "h12"}, &c); err != nil {
		t.Fatal(err)
	}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "h1", UID: e.pod("h1").UID}}
	if err := e.c.Status().Update(e.ctx, &c); err != nil {
		t.Fatal(err)
	}

	type seen struct {
		usage   *v1alpha1.QueueUsage
		started time.Time // lastUpdated - total / 12 GiB
	}
	read := func() (seen, error) {
		u := e.queueStatus("team").Usage
		if u == nil {
			return seen{}, fmt.Errorf("no status.usage")
		}
		total := history.ParseDecimal(u.Total.AllocatedMemoryGiBHours)
		if total <= 0 || history.ParseDecimal(u.Total.AllocatedGPUHours) <= 0 {
			return seen{}, fmt.Errorf("nothing integrated yet: %+v", u.Total)
		}
		return seen{u, u.LastUpdated.Add(-time.Duration(total / 12 * float64(time.Hour)))}, nil
	}
	var first seen
	testutil.Eventually(t, 30*time.Second, "the history integrates the 12Gi share", func() (err error) {
		first, err = read()
		return err
	})
	last := first
	// goesOn waits for updates at least 3 s after the last one seen and
	// checks that they continue the same integration.
	goesOn := func(what string) {
		t.Helper()
		var now seen
		testutil.Eventually(t, 30*time.Second, what, func() (err error) {
			if now, err = read(); err != nil {
				return err
			}
			if now.usage.LastUpdated.Sub(last.usage.LastUpdated.Time) < 3*time.Second {
				return fmt.Errorf("last updated %s", now.usage.LastUpdated)
			}
			return nil
		})
		if d := now.started.Sub(first.started); math.Abs(d.Seconds()) > 1 {
			t.Errorf("%s: the integration implies the claim was first seen at %s, not %s (%s off): total %s GiB-hours at %s",
				what, now.started.Format(time.RFC3339Nano), first.started.Format(time.RFC3339Nano), d, now.usage.Total.AllocatedMemoryGiBHours, now.usage.LastUpdated)
		}
		if !now.usage.Since.Equal(&first.usage.Since) {
			t.Errorf("%s: since %s, was %s", what, now.usage.Since, first.usage.Since)
		}
		if d, tot := history.ParseDecimal(now.usage.Decayed.AllocatedMemoryGiBHours), history.ParseDecimal(now.usage.Total.AllocatedMemoryGiBHours); d <= 0 || d >= tot {
			t.Errorf("%s: decayed %v GiB-hours, total %v: want 0 < decayed < total", what, d, tot)
		}
		last = now
	}
	goesOn("updates of the first controller")

	e.stopController()
	time.Sleep(3 * time.Second)
	e.startController()
	goesOn("after a restart")

	second := e.startReplica(testutil.FreePort(t))
	e.stopController() // releases the lease; the second replica leads
	e.cur = second
	goesOn("after a leader change")

	tbl := e.table("team")
	cols := map[string]int{}
	for i, col := range tbl.ColumnDefinitions {
		cols[col.Name] = i
	}
	for _, name := range []string{"GPUh-Alloc", "GPUh-Used", "GiBh-Alloc", "GiBh-Used"} {
		i, ok := cols[name]
		if !ok {
			t.Errorf("kubectl get queues -o wide has no column %s: %+v", name, tbl.ColumnDefinitions)
			continue
		}
		if tbl.ColumnDefinitions[i].Priority != 1 {
			t.Errorf("column %s has priority %d: only -o wide should show it", name, tbl.ColumnDefinitions[i].Priority)
		}
	}
	if i, ok := cols["GiBh-Alloc"]; ok {
		if cell := fmt.Sprint(tbl.Rows[0].Cells[i]); history.ParseDecimal(v1alpha1.Decimal(cell)) <= 0 || strings.TrimSpace(cell) == "" {
			t.Errorf("GiBh-Alloc cell %q", cell)
		}
	}
	e.stopController()
}
