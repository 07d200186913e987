package prepare

import (
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/node/timeslice"
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

// TestExclusiveExcludesTheLibraryLock checks that the lock Exclusive takes
// is the kind the plugin library takes on serialize.lock (an open file
// description write lock): another open file description sees it as a
// conflicting write lock, a second Exclusive waits for the first release,
// and nothing is held afterwards.
func TestExclusiveExcludesTheLibraryLock(t *testing.T) {
	e := newEnv(t, withSharedLock())
	path := e.opts.SharedLock
	held := func() int16 {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		probe := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
		if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &probe); err != nil {
			t.Fatal(err)
		}
		return probe.Type
	}
	release, err := e.p.Exclusive()
	if err != nil {
		t.Fatal(err)
	}
	if got := held(); got != unix.F_WRLCK {
		t.Fatalf("lock type seen by another open file description = %d, want F_WRLCK", got)
	}
	second := make(chan func())
	go func() {
		r, err := e.p.Exclusive()
		if err != nil {
			t.Error(err)
			r = func() {}
		}
		second <- r
	}()
	select {
	case r := <-second:
		r()
		t.Fatal("a second Exclusive did not wait for the first release")
	case <-time.After(200 * time.Millisecond):
	}
	release()
	select {
	case r := <-second:
		r()
	case <-time.After(10 * time.Second):
		t.Fatal("a second Exclusive still waits after the first release")
	}
	if got := held(); got != unix.F_UNLCK {
		t.Fatalf("lock type after release = %d, want F_UNLCK", got)
	}
}
