package webhook_test

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/tessera-dev/tessera/pkg/webhook"
)

// countingReader counts the Gets that reach a reader.
type countingReader struct {
	client.Reader
	gets int
	err  error
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.gets++
	if c.err != nil {
		return c.err
	}
	return c.Reader.Get(ctx, key, obj, opts...)
}

// The pod webhook reads from the cache; the API server is asked only for
// what the cache does not hold yet, and a cache failure is not hidden.
func TestCacheFirst(t *testing.T) {
	s := scheme(t)
	stale := namespace("team-a", map[string]string{"team": "a"})
	fresh := namespace("team-a", map[string]string{"team": "a", "new": "yes"})
	created := namespace("just-created", nil)
	tests := []struct {
		name                   string
		key                    string
		cacheErr               error
		wantLabels             int
		wantErr                bool
		wantCacheGets, wantAPI int
	}{
		{name: "in the cache: the API server is not asked", key: "team-a", wantLabels: 1, wantCacheGets: 1},
		{name: "not in the cache yet: asked", key: "just-created", wantLabels: 0, wantCacheGets: 1, wantAPI: 1},
		{name: "in neither: not found", key: "gone", wantErr: true, wantCacheGets: 1, wantAPI: 1},
		{name: "a cache failure is returned, not papered over", key: "team-a", cacheErr: errors.New("cache not started"), wantErr: true, wantCacheGets: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cache := &countingReader{Reader: fake.NewClientBuilder().WithScheme(s).WithObjects(stale).Build(), err: tc.cacheErr}
			api := &countingReader{Reader: fake.NewClientBuilder().WithScheme(s).WithObjects(fresh, created).Build()}
			var ns corev1.Namespace
			err := webhook.CacheFirst(cache, api).Get(context.Background(), client.ObjectKey{Name: tc.key}, &ns)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Get(%s) = %v, want error %v", tc.key, err, tc.wantErr)
			}
			if tc.key == "gone" && !apierrors.IsNotFound(err) {
				t.Errorf("Get of a missing namespace = %v, want NotFound", err)
			}
			if err == nil && len(ns.Labels) != tc.wantLabels {
				t.Errorf("labels %v, want %d (the cache's copy when it has one)", ns.Labels, tc.wantLabels)
			}
			if cache.gets != tc.wantCacheGets || api.gets != tc.wantAPI {
				t.Errorf("cache gets %d, API gets %d; want %d and %d", cache.gets, api.gets, tc.wantCacheGets, tc.wantAPI)
			}
		})
	}
}
