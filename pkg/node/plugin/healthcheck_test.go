package plugin

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/test/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/ktesting"
)

// TestHealthcheck probes the plugin's gRPC health service as the kubelet's
// probes do, with and without rolling-update mode (whose sockets carry the
// pod UID): alive once both kubelet sockets answer, ready once published,
// and not alive when a socket disappears.
func TestHealthcheck(t *testing.T) {
	for _, podUID := range []string{"", "pod-a"} {
		t.Run("pod-uid="+podUID, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			dir := tempDir(t)
			opts := nodeOptions(dir, "t4:1", false, nil)
			opts.PodUID, opts.HealthcheckAddress, opts.HealthcheckPort = podUID, "127.0.0.1", 0
			opts.HealthcheckSocket = filepath.Join(dir, "health.sock")
			h := startHarness(t, ctx, opts)
			conn, err := grpc.NewClient(h.driver.healthServer.addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			client := healthpb.NewHealthClient(conn)
			check := func(service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
				resp, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
				return resp.GetStatus(), err
			}
			for _, service := range []string{HealthLiveness, HealthReadiness, HealthStartup, ""} {
				testutil.EventuallyTrue(t, 10*time.Second, service+" serving", func() bool {
					s, err := check(service)
					return err == nil && s == healthpb.HealthCheckResponse_SERVING
				})
			}
			// The exec probe asks the same service over the Unix socket.
			for _, service := range []string{HealthLiveness, HealthReadiness, HealthStartup} {
				if err := Probe(ctx, opts.HealthcheckSocket, service); err != nil {
					t.Errorf("exec probe %s: %v", service, err)
				}
			}
			if _, err := check("nonsense"); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), HealthLiveness) {
				t.Errorf("unknown service: %v, want NotFound naming the services", err)
			}
			reg, dra := opts.socketPaths()
			if !strings.Contains(dra, podUID) || (podUID != "" && !strings.Contains(reg, "-reg.sock")) {
				t.Errorf("sockets %s, %s", reg, dra)
			}
			if err := os.Remove(dra); err != nil {
				t.Fatal(err)
			}
			for _, service := range []string{HealthLiveness, HealthReadiness} {
				if s, err := check(service); err != nil || s != healthpb.HealthCheckResponse_NOT_SERVING {
					t.Errorf("%s without the DRA socket: %v %v, want NOT_SERVING", service, s, err)
				}
				if err := Probe(ctx, opts.HealthcheckSocket, service); err == nil || !strings.Contains(err.Error(), "NOT_SERVING") {
					t.Errorf("exec probe %s without the DRA socket: %v, want NOT_SERVING", service, err)
				}
			}
		})
	}
}

// TestSeamlessUpgradeOverGRPC runs an old and a new plugin process side by
// side over one node, as a rolling update does, and calls both as the
// kubelet may: a device prepared through one is never prepared again
// through the other, and either unprepares what the other prepared.
func TestSeamlessUpgradeOverGRPC(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := tempDir(t)
	a := newClaim("a", shareResult("gpu", "gpu-0", "share-1", 10*gib, 0))
	b := newClaim("b", shareResult("gpu", "gpu-0", "share-2", 10*gib, 0))
	client := newFakeClient(nodeObject(), a, b)
	oldOpts := nodeOptions(dir, "t4:1", false, nil)
	oldOpts.PodUID = "pod-old"
	old := startHarnessWith(t, ctx, oldOpts, client)
	if resp, err := old.prepare(a); err != nil || resp.Claims[string(a.UID)].GetError() != "" {
		t.Fatalf("old prepares a: %v %v", err, resp)
	}
	newOpts := nodeOptions(dir, "t4:1", false, nil)
	newOpts.PodUID = "pod-new"
	fresh := startHarnessWith(t, ctx, newOpts, client)
	resp, err := fresh.prepare(b)
	if err != nil {
		t.Fatal(err)
	}
	if e := resp.Claims[string(b.UID)].GetError(); !strings.Contains(e, "oversubscribed") {
		t.Errorf("new prepares b next to a: error %q, want oversubscribed", e)
	}
	if resp, err := fresh.unprepare(a); err != nil || resp.Claims[string(a.UID)].GetError() != "" {
		t.Fatalf("new unprepares a: %v %v", err, resp)
	}
	if resp, err := old.prepare(b); err != nil || resp.Claims[string(b.UID)].GetError() != "" {
		t.Fatalf("old prepares b after a went: %v %v", err, resp)
	}
	old.stop()
	if resp, err := fresh.unprepare(b); err != nil || resp.Claims[string(b.UID)].GetError() != "" {
		t.Fatalf("new unprepares b after the old process stopped: %v %v", err, resp)
	}
	if left := dirEntries(newOpts.CDIRoot); len(left) > 0 {
		t.Errorf("CDI specs left: %v", left)
	}
}
