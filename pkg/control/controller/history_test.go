package controller

import (
	"context"
	"math"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/history"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

// TestHistoryKeeperIntegratesOnce: a 12Gi claim held for the whole run is
// integrated exactly once per second of it, whether the keeper's cache
// sees its own patches at once or never (a lagging watch): updates at
// irregular sub-second times must neither integrate a part of a second
// twice (status.usage.lastUpdated has second precision) nor start over
// from an older cached status.
func TestHistoryKeeperIntegratesOnce(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 10, 0, 0, 300e6, time.UTC)
	for _, tc := range []struct {
		name  string
		stale bool
	}{{"cache follows", false}, {"cache lags behind the patches", true}} {
		t.Run(tc.name, func(t *testing.T) {
			scheme, err := NewScheme()
			if err != nil {
				t.Fatal(err)
			}
			objs := func() []client.Object {
				return []client.Object{
					&v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "team", UID: "q-team"}},
					&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "pod-p", Labels: map[string]string{v1alpha1.QueueLabel: "team"}},
						Status: corev1.PodStatus{Phase: corev1.PodRunning}},
					&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}, Status: resourceapi.ResourceClaimStatus{
						Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
							Request: "gpu", Driver: devicemodel.DriverName, Pool: "node-1", Device: "gpu-0",
							ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{devicemodel.CapMemory: resource.MustParse("12Gi")}}}}},
						ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: types.UID("pod-p")}}}},
				}
			}
			build := func() client.Client {
				return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs()...).WithStatusSubresource(&v1alpha1.Queue{}).Build()
			}
			c := build()
			reader := client.Reader(c)
			if tc.stale {
				reader = build() // never sees the patches
			}
			now := t0
			k := &HistoryKeeper{Client: c, Reader: reader, Every: time.Second, Now: func() time.Time { return now },
				Config: history.Config{MaxGap: time.Hour, Days: 2}}
			for i := range 40 {
				if err := k.Update(context.Background()); err != nil {
					t.Fatal(err)
				}
				now = now.Add(time.Duration(700+i*37) * time.Millisecond)
			}
			var q v1alpha1.Queue
			if err := c.Get(context.Background(), client.ObjectKey{Name: "team"}, &q); err != nil {
				t.Fatal(err)
			}
			u := q.Status.Usage
			if u == nil {
				t.Fatal("no status.usage")
			}
			held := u.LastUpdated.Sub(u.Since.Time)
			if !u.Since.Time.Equal(t0.Truncate(time.Second)) || held < 50*time.Second {
				t.Fatalf("history from %s to %s, want from %s on for the whole run", u.Since, u.LastUpdated, t0.Truncate(time.Second))
			}
			want := 12 * held.Hours()
			if got := history.ParseDecimal(u.Total.AllocatedMemoryGiBHours); math.Abs(got-want) > 2e-6 {
				t.Errorf("12Gi held for %s: %.6f GiB-hours, want %.6f", held, got, want)
			}
		})
	}
}
