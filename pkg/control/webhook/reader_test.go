package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide/decidetest"
	"github.com/tessera-dev/tessera/pkg/control/webhook"
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

// A namespace labelled as managed a moment ago may still be unmanaged in
// the webhook's cache: the gater reads it again from the API server before
// it lets a claim user without a queue label through ungated, and asks the
// API server for nothing else.
func TestPodGaterReadsThroughStaleNamespace(t *testing.T) {
	s := scheme(t)
	ctx := context.Background()
	withClaim := decidetest.PodOptions{Templates: []string{"gpu"}}
	tests := []struct {
		name      string
		cached    map[string]string // the namespace's labels in the cache
		api       map[string]string // and in the API server
		apiErr    error
		pod       decidetest.PodOptions
		wantQueue string // the queue the patch stamps; "" = none
		wantGate  bool
		wantError bool
		wantAPI   int
	}{
		{name: "labelled since the cache synced: the API server's view decides", cached: nil, api: map[string]string{v1alpha1.QueueLabel: "team-a"}, pod: withClaim, wantQueue: "team-a", wantGate: true, wantAPI: 1},
		{name: "unmanaged in both: not touched", cached: nil, api: nil, pod: withClaim, wantAPI: 1},
		{name: "API server unreachable: refused, not let through", cached: nil, api: map[string]string{v1alpha1.QueueLabel: "team-a"}, apiErr: errors.New("connection refused"), pod: withClaim, wantError: true, wantAPI: 1},
		{name: "managed in the cache: not asked", cached: map[string]string{v1alpha1.QueueLabel: "team-a"}, api: map[string]string{v1alpha1.QueueLabel: "team-a"}, pod: withClaim, wantQueue: "team-a", wantGate: true},
		{name: "the pod names its queue: not asked", cached: nil, api: map[string]string{v1alpha1.QueueLabel: "team-a"}, pod: decidetest.PodOptions{Queue: "team-a", Templates: []string{"gpu"}}, wantGate: true},
		{name: "no claim: not asked, not touched", cached: nil, api: map[string]string{v1alpha1.QueueLabel: "team-a"}, pod: decidetest.PodOptions{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			queue := decidetest.Queue("team-a", "", "16Gi", "")
			cache := &countingReader{Reader: fake.NewClientBuilder().WithScheme(s).WithObjects(namespace("ns", tc.cached), queue.DeepCopy()).Build()}
			api := &countingReader{Reader: fake.NewClientBuilder().WithScheme(s).WithObjects(namespace("ns", tc.api), queue.DeepCopy()).Build(), err: tc.apiErr}
			g := &webhook.PodGater{Decoder: webhook.NewDecoder(s), Reader: webhook.CacheFirst(cache, api)}
			resp := g.Handle(ctx, request(t, admissionv1.Create, "p", decidetest.Pod("ns", "p", tc.pod)))
			if api.gets != tc.wantAPI {
				t.Errorf("API server asked %d times, want %d", api.gets, tc.wantAPI)
			}
			if tc.wantError {
				if resp.Allowed {
					t.Fatalf("allowed with patches %v, want an error", resp.Patches)
				}
				return
			}
			if !resp.Allowed {
				t.Fatalf("refused: %v", resp.Result)
			}
			data, _ := json.Marshal(resp.Patches)
			if got := strings.Contains(string(data), v1alpha1.AdmissionGate); got != tc.wantGate {
				t.Errorf("patch %s adds the gate: %v, want %v", data, got, tc.wantGate)
			}
			if got := strings.Contains(string(data), "tessera.dev~1queue") || strings.Contains(string(data), `"tessera.dev/queue"`); got != (tc.wantQueue != "") {
				t.Errorf("patch %s sets the queue label: %v, want %q", data, got, tc.wantQueue)
			}
			if tc.wantQueue != "" && !strings.Contains(string(data), `"`+tc.wantQueue+`"`) {
				t.Errorf("patch %s does not name queue %s", data, tc.wantQueue)
			}
		})
	}
}

// Tessera's mutating webhook writes no tessera.dev/ key on the tenant's
// behalf but the queue label (the policy <release>-pod-tessera-keys lets
// only the controller write the others): whatever it patches, the only
// tessera.dev/ label or annotation it adds is tessera.dev/queue.
func TestPodGaterWritesOnlyTheQueueLabel(t *testing.T) {
	s := scheme(t)
	r := fake.NewClientBuilder().WithScheme(s).WithObjects(namespace("managed", map[string]string{v1alpha1.QueueLabel: "team-a"}), decidetest.Queue("team-a", "", "16Gi", "")).Build()
	g := &webhook.PodGater{Decoder: webhook.NewDecoder(s), Reader: r}
	for _, o := range []decidetest.PodOptions{
		{Templates: []string{"gpu"}}, {Queue: "team-a"}, {Queue: "team-a", Gang: "g", GangSize: "2"}, {Templates: []string{"gpu"}, Gated: true},
	} {
		resp := g.Handle(context.Background(), request(t, admissionv1.Create, "p", decidetest.Pod("managed", "p", o)))
		if !resp.Allowed {
			t.Fatalf("%+v refused: %v", o, resp.Result)
		}
		for _, op := range resp.Patches {
			var keys []string
			for _, field := range []string{"/metadata/labels", "/metadata/annotations"} {
				switch {
				case op.Path == field:
					m, _ := op.Value.(map[string]any)
					for k := range m {
						keys = append(keys, field+"/"+k)
					}
				case strings.HasPrefix(op.Path, field+"/"):
					keys = append(keys, field+"/"+strings.ReplaceAll(strings.ReplaceAll(strings.TrimPrefix(op.Path, field+"/"), "~1", "/"), "~0", "~"))
				}
			}
			for _, k := range keys {
				if strings.Contains(k, "/tessera.dev/") && k != "/metadata/labels/"+v1alpha1.QueueLabel {
					t.Errorf("%+v: the webhook writes %s (%s) on the tenant's behalf", o, k, op.Operation)
				}
			}
		}
	}
}
