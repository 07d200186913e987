package timeslice

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

func TestManager(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	path := filepath.Join(t.TempDir(), "mock-timeslice.json")
	m := NewManager(&FileRecorder{Path: path})
	a, b, c := Holder{UID: "a", Name: "ns/a"}, Holder{UID: "b", Name: "ns/b"}, Holder{UID: "c", Name: "ns/c"}
	recorded := func() v1alpha1.TimeSliceInterval {
		t.Helper()
		st, err := ReadRecorded(path)
		if err != nil {
			t.Fatal(err)
		}
		return st["GPU-0"]
	}
	if err := m.Acquire(ctx, "GPU-0", a, v1alpha1.TimeSliceShort); err != nil {
		t.Fatal(err)
	}
	if recorded() != v1alpha1.TimeSliceShort {
		t.Errorf("recorded %s", recorded())
	}
	if err := m.Acquire(ctx, "GPU-0", b, v1alpha1.TimeSliceShort); err != nil {
		t.Fatalf("same interval: %v", err)
	}
	err := m.Acquire(ctx, "GPU-0", c, v1alpha1.TimeSliceLong)
	var conflict *Conflict
	if !errors.As(err, &conflict) {
		t.Fatalf("want conflict, got %v", err)
	}
	for _, s := range []string{"GPU-0", "ns/c", "Long", "Short", "ns/a, ns/b"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("message %q lacks %q", err, s)
		}
	}
	// Another namespace's claim is counted, never named.
	other := Holder{UID: "x", Name: "tenant-b/secret-training"}
	err = m.Check("GPU-0", other, v1alpha1.TimeSliceLong)
	if err == nil || strings.Contains(err.Error(), "ns/") || !strings.Contains(err.Error(), "2 claim(s) of other namespaces") {
		t.Errorf("message to another namespace: %v", err)
	}
	// Another GPU is independent.
	if err := m.Acquire(ctx, "GPU-1", c, v1alpha1.TimeSliceLong); err != nil {
		t.Fatal(err)
	}
	// Re-acquiring by the same claim is idempotent.
	if err := m.Acquire(ctx, "GPU-0", a, v1alpha1.TimeSliceShort); err != nil {
		t.Fatal(err)
	}
	must(t, m.Release(ctx, "GPU-0", "a"))
	if recorded() != v1alpha1.TimeSliceShort {
		t.Error("reset while a claim still holds the GPU")
	}
	must(t, m.Release(ctx, "GPU-0", "b"))
	if recorded() != v1alpha1.TimeSliceDefault {
		t.Errorf("not reset: %s", recorded())
	}
	if err := m.Acquire(ctx, "GPU-0", c, v1alpha1.TimeSliceLong); err != nil {
		t.Fatalf("after release: %v", err)
	}
	if iv, names := m.Interval("GPU-0"); iv != v1alpha1.TimeSliceLong || len(names) != 1 {
		t.Errorf("interval %s %v", iv, names)
	}
	// A lone holder may change its mind (reprepare with a new config).
	if err := m.Check("GPU-0", c, v1alpha1.TimeSliceMedium); err != nil {
		t.Errorf("lone holder: %v", err)
	}
	m.Restore("GPU-2", a, v1alpha1.TimeSliceMedium)
	if err := m.Check("GPU-2", b, v1alpha1.TimeSliceLong); err == nil {
		t.Error("restored holder not enforced")
	}
}

type failing struct{}

func (failing) SetInterval(context.Context, string, v1alpha1.TimeSliceInterval) error {
	return errors.New("boom")
}

func TestSetterFailureDoesNotHold(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m := NewManager(failing{})
	if err := m.Acquire(ctx, "GPU-0", Holder{UID: "a", Name: "ns/a"}, v1alpha1.TimeSliceLong); err == nil {
		t.Fatal("no error")
	}
	if iv, _ := m.Interval("GPU-0"); iv != "" {
		t.Errorf("held after failure: %s", iv)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// blocking holds SetInterval on one GPU until released.
type blocking struct {
	gpu     string
	entered chan struct{}
	release chan struct{}
}

func (b blocking) SetInterval(_ context.Context, gpu string, _ v1alpha1.TimeSliceInterval) error {
	if gpu == b.gpu {
		close(b.entered)
		<-b.release
	}
	return nil
}

// TestSlowGPUHoldsOnlyItself: while one GPU's interval is being set (a slow
// nvidia-smi), claims on another GPU are served and the same GPU waits.
func TestSlowGPUHoldsOnlyItself(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	b := blocking{gpu: "GPU-0", entered: make(chan struct{}), release: make(chan struct{})}
	m := NewManager(b)
	first := make(chan error, 1)
	go func() { first <- m.Acquire(ctx, "GPU-0", Holder{UID: "a", Name: "ns/a"}, v1alpha1.TimeSliceLong) }()
	<-b.entered
	other := make(chan error, 1)
	go func() { other <- m.Acquire(ctx, "GPU-1", Holder{UID: "b", Name: "ns/b"}, v1alpha1.TimeSliceShort) }()
	select {
	case err := <-other:
		must(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("a claim on GPU-1 waited for GPU-0's nvidia-smi")
	}
	same := make(chan error, 1)
	go func() { same <- m.Acquire(ctx, "GPU-0", Holder{UID: "c", Name: "ns/c"}, v1alpha1.TimeSliceShort) }()
	select {
	case err := <-same:
		t.Fatalf("a second claim on GPU-0 was decided while its interval was being set: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(b.release)
	must(t, <-first)
	var conflict *Conflict
	if err := <-same; !errors.As(err, &conflict) || conflict.Held != v1alpha1.TimeSliceLong {
		t.Errorf("second claim on GPU-0: %v, want a conflict with Long", err)
	}
}
