package testutil

import (
	"context"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// WriteLog is a client that records every create, update, patch and
// delete that reaches the client it wraps, as "<op> <Kind> <ns>/<name>".
type WriteLog struct {
	client.Client
	mu     sync.Mutex
	writes []string
}

// Writes are the writes so far.
func (w *WriteLog) Writes() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.writes...)
}

// Reset forgets the writes so far.
func (w *WriteLog) Reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = nil
}

func (w *WriteLog) log(op string, obj client.Object) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = append(w.writes, op+" "+obj.GetObjectKind().GroupVersionKind().Kind+" "+obj.GetNamespace()+"/"+obj.GetName())
}

func (w *WriteLog) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	w.log("create", obj)
	return w.Client.Create(ctx, obj, opts...)
}

func (w *WriteLog) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	w.log("update", obj)
	return w.Client.Update(ctx, obj, opts...)
}

func (w *WriteLog) Patch(ctx context.Context, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
	w.log("patch", obj)
	return w.Client.Patch(ctx, obj, p, opts...)
}

func (w *WriteLog) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	w.log("delete", obj)
	return w.Client.Delete(ctx, obj, opts...)
}
