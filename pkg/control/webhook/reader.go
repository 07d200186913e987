package webhook

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CacheFirst reads objects from the informer cache and asks the API server
// only for those the cache does not hold (yet): an object created a moment
// before the request that needs it. The pod webhook runs in the API
// server's path of every pod creation; reading from the API server there
// put two requests, subject to the controller's client rate limit, in front
// of every pod (at 4,000 pods the limit held pod creation at about 50/s,
// docs/benchmarks.md#scale-end-to-end).
//
// Use it only for objects a tenant cannot change (Namespaces, Queues,
// DeviceClasses need cluster-level rights): a cache is milliseconds behind
// the API server, and a tenant who could change an object could race the
// webhook's view of it. Those objects change only with an administrator's
// action, and a pod created within milliseconds of that change is judged
// by the object as it was just before, except where that view would let
// the pod skip its queue: the pod webhook reads a namespace that the cache
// holds as unmanaged again through ReadThrough before it lets a claim user
// through ungated.
func CacheFirst(cache, direct client.Reader) ReadThrough {
	return &cacheFirst{cache: cache, direct: direct}
}

// ReadThrough is a reader that reads from a cache and can also be asked to
// read past it, from the API server.
type ReadThrough interface {
	client.Reader
	// ReadThrough returns the reader that asks the API server.
	ReadThrough() client.Reader
}

type cacheFirst struct{ cache, direct client.Reader }

func (r *cacheFirst) ReadThrough() client.Reader { return r.direct }

func (r *cacheFirst) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	err := r.cache.Get(ctx, key, obj, opts...)
	if apierrors.IsNotFound(err) {
		return r.direct.Get(ctx, key, obj, opts...)
	}
	return err
}

func (r *cacheFirst) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return r.cache.List(ctx, list, opts...)
}
