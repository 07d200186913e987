package plugin

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/tessera-dev/tessera/test/testutil"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// BenchmarkPrepareLatency measures NodePrepareResources and
// NodeUnprepareResources as the kubelet sees them, through the plugin's
// Unix socket, per claim kind, and reports the p50 and p99 of each in
// milliseconds. MIG runs against the mock, whose instance creation is
// instant: the figure is Tessera's own cost (checkpoint writes included),
// real MIG creation takes about a second more.
//
//	go test -run='^$' -bench=BenchmarkPrepareLatency -benchtime=2000x ./pkg/node/plugin/
//
// The node's directories are temporary ones under $TMPDIR, or under
// $TESSERA_BENCH_DIR when set (e.g. /dev/shm, to take the disk out).
func BenchmarkPrepareLatency(b *testing.B) {
	kinds := []struct {
		name  string
		claim func(i int) *resourceapi.ResourceClaim
	}{
		{"share", func(i int) *resourceapi.ResourceClaim {
			return withGpuConfig(newClaim("share-"+strconv.Itoa(i), shareResult("gpu", "gpu-0", "s-"+strconv.Itoa(i), gib, 25)), nil, `"enforcement":"interposer"`)
		}},
		{"whole", func(i int) *resourceapi.ResourceClaim {
			return newClaim("whole-"+strconv.Itoa(i), deviceResult("gpu", "gpu-1"))
		}},
		{"timeslice", func(i int) *resourceapi.ResourceClaim {
			return withGpuConfig(newClaim("ts-"+strconv.Itoa(i), deviceResult("ts", "gpu-2-ts-1")), nil, `"timeSliceInterval":"Short"`)
		}},
		{"mig", func(i int) *resourceapi.ResourceClaim {
			return newClaim("mig-"+strconv.Itoa(i), deviceResult("mig", "gpu-3-mig-1g5gb-6"))
		}},
	}
	for _, k := range kinds {
		b.Run(k.name, func(b *testing.B) {
			ctx := klog.NewContext(context.Background(), logr.Discard())
			dir := tempDir(b)
			if base := os.Getenv("TESSERA_BENCH_DIR"); base != "" {
				d, err := os.MkdirTemp(base, "tsr")
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = os.RemoveAll(d) })
				dir = d
			}
			opts := nodeOptions(dir, "t4:3,a100-40gb", true, map[string]int{"2": 4})
			h := startBenchHarness(b, ctx, opts)
			var prep, unprep []time.Duration
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				c := k.claim(i)
				h.addClaims(c)
				b.StartTimer()
				t0 := time.Now()
				resp, err := h.prepare(c)
				t1 := time.Now()
				if err != nil || resp.Claims[string(c.UID)].GetError() != "" {
					b.Fatalf("prepare: %v %v", err, resp)
				}
				un, err := h.unprepare(c)
				t2 := time.Now()
				if err != nil || un.Claims[string(c.UID)].GetError() != "" {
					b.Fatalf("unprepare: %v %v", err, un)
				}
				prep = append(prep, t1.Sub(t0))
				unprep = append(unprep, t2.Sub(t1))
			}
			b.StopTimer()
			report(b, "prepare", prep)
			report(b, "unprepare", unprep)
		})
	}
}

func report(b *testing.B, what string, d []time.Duration) {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	q := func(p float64) float64 {
		return float64(d[min(len(d)-1, int(p*float64(len(d))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.50), what+"-p50-ms")
	b.ReportMetric(q(0.99), what+"-p99-ms")
	if os.Getenv("TESSERA_BENCH_VERBOSE") != "" {
		fmt.Printf("%s %s: n=%d p50=%.3fms p99=%.3fms max=%.3fms\n", b.Name(), what, len(d), q(0.5), q(0.99), q(1))
	}
}

// startBenchHarness is startHarness with an API server that answers
// status writes at once, so that the benchmark measures the plugin.
func startBenchHarness(b *testing.B, ctx context.Context, opts *Options) *harness {
	h := startHarnessWith(b, ctx, opts, newLightFakeClient(nodeObject()))
	// Let the first ResourceSlice publish settle.
	testutil.EventuallyTrue(b, 10*time.Second, "slices", func() bool {
		l, err := h.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		return err == nil && len(l.Items) > 0
	})
	return h
}
