package controller

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/rest"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2/ktesting"
)

// TestSchedulerFeatures: the admission simulation uses the allocator
// features of the cluster's own scheduler version, which the flags can
// override.
func TestSchedulerFeatures(t *testing.T) {
	served := "v1.35.3"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/version" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(version.Info{Major: "1", Minor: "35", GitVersion: served})
	}))
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL}
	v135 := structured.Features{AdminAccess: true, PrioritizedList: true}
	for _, tt := range []struct {
		name string
		opts Options
		want structured.Features
		err  string
	}{
		{name: "API server's version", want: v135},
		{name: "gates turned on", opts: Options{SchedulerFeatureGates: "DRAConsumableCapacity=true,DRAPartitionableDevices=true"},
			want: structured.Features{AdminAccess: true, PrioritizedList: true, ConsumableCapacity: true, PartitionableDevices: true}},
		{name: "version flag", opts: Options{KubernetesVersion: "v1.37.0"}, want: structured.Features{AdminAccess: true, PrioritizedList: true,
			ConsumableCapacity: true, PartitionableDevices: true, DeviceTaints: true, DeviceBindingAndStatus: true, FractionalCapacityRange: true}},
		{name: "unknown gate", opts: Options{SchedulerFeatureGates: "Nope=true"}, err: "--scheduler-feature-gates"},
		{name: "too old", opts: Options{KubernetesVersion: "v1.32.0"}, err: "not supported"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			got, err := schedulerFeatures(ctx, cfg, tt.opts)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}
