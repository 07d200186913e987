package prepare

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/timeslice"
)

// TestSeamlessUpgradeSharesState runs two Preparers over one node's
// directories, as the old and the new plugin pod of a seamless upgrade do,
// each kubelet call under the shared lock: neither hands out a device the
// other prepared, and each unprepares what the other prepared.
func TestSeamlessUpgradeSharesState(t *testing.T) {
	old := newEnv(t, withSharedLock(), withTimeSlices(2))
	old.call(old.p, "prepare a", func(p *Preparer) error {
		_, err := p.Prepare(old.ctx, claim("a", share("gpu", "gpu-0", "s-1", 10*gib, 0)))
		return err
	})
	// The new pod starts while the old one serves.
	opts := old.opts
	opts.TimeSlice = timeslice.NewManager(&timeslice.FileRecorder{Path: old.dir + "/mock-timeslice.json"})
	fresh := New(opts)
	if err := fresh.Recover(old.ctx); err != nil {
		t.Fatal(err)
	}
	if got := fresh.Prepared(); len(got) != 1 {
		t.Fatalf("new process recovered %v, want claim a", got)
	}
	// The old one keeps serving after the new one started.
	old.call(old.p, "prepare b", func(p *Preparer) error {
		_, err := p.Prepare(old.ctx, claim("b", device("ts", "gpu-1-ts-0")))
		return err
	})
	for _, tt := range []struct {
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{claim("c", share("gpu", "gpu-0", "s-2", 10*gib, 0)), "oversubscribed"},
		{claim("d", device("ts", "gpu-1-ts-0")), "already prepared for claim ns/b"},
	} {
		var err error
		old.call(fresh, "", func(p *Preparer) error {
			_, err = p.Prepare(old.ctx, tt.claim)
			return nil
		})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("new process prepared %s: error %v, want %q", tt.claim.Name, err, tt.want)
		}
	}
	// The kubelet may ask either process to unprepare.
	a := claim("a", share("gpu", "gpu-0", "s-1", 10*gib, 0))
	old.call(fresh, "unprepare a", func(p *Preparer) error {
		return p.Unprepare(old.ctx, types.NamespacedName{Namespace: a.Namespace, Name: a.Name}, a.UID)
	})
	old.call(old.p, "prepare c after a went", func(p *Preparer) error {
		_, err := p.Prepare(old.ctx, claim("c", share("gpu", "gpu-0", "s-2", 10*gib, 0)))
		return err
	})
	old.call(fresh, "", func(p *Preparer) error {
		if got := p.Prepared(); len(got) != 2 {
			t.Errorf("new process sees %v, want claims b and c", got)
		}
		return nil
	})
}

// call runs f as one kubelet call of p: under the lock both processes
// share, between SyncShared and PublishShared (what the plugin library and
// the driver do around PrepareResourceClaims and UnprepareResourceClaims).
func (e *env) call(p *Preparer, what string, f func(*Preparer) error) {
	e.t.Helper()
	release, err := p.Exclusive()
	if err != nil {
		e.t.Fatal(err)
	}
	defer release()
	if err := p.SyncShared(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	if err := f(p); err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
	if err := p.PublishShared(); err != nil {
		e.t.Fatal(err)
	}
}
