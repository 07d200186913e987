package plugin

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/atomicfile"
	"github.com/tessera-dev/tessera/test/testutil"
)

// BenchmarkAtomicWrite measures what the disk alone costs a share's
// prepare: one atomic write of a checkpoint record as checkpoint.Store.Put
// makes it (atomicfile.Write: temp file, write, fsync, rename, fsync of the
// directory), in a checkpoint directory laid out like the plugin's, on the
// same file system as BenchmarkPrepareLatency. It reports the p50 and p99
// of one write in milliseconds. Declared first so that `go test` runs it
// right before the share prepare: make bench holds that prepare's p99 to a
// ratio of this one, because an fsync's absolute time moves with the disk.
//
//	go test -run='^$' -bench='AtomicWrite|PrepareLatency' -benchtime=2000x ./pkg/node/plugin/
func BenchmarkAtomicWrite(b *testing.B) {
	dir := filepath.Join(benchDir(b), "plugin", checkpointDir)
	// A share's record with its CDI spec is about 2.8 KiB: one page either
	// way, so the write costs its fsyncs, not its bytes.
	data := bytes.Repeat([]byte{'x'}, 3<<10)
	var writes []time.Duration
	b.ResetTimer()
	for i := range b.N {
		path := filepath.Join(dir, "uid-write-"+strconv.Itoa(i)+".json")
		t0 := time.Now()
		if err := atomicfile.Write(path, data, 0o600); err != nil {
			b.Fatal(err)
		}
		writes = append(writes, time.Since(t0))
		// Unprepare deletes the record without fsync, outside the prepare's
		// time: so does this, so that the directory stays as small.
		b.StopTimer()
		if err := os.Remove(path); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	report(b, "write", writes)
}

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
			opts := nodeOptions(benchDir(b), "t4:3,a100-40gb", true, map[string]int{"2": 4})
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

// benchDir is a node's directory for a benchmark: a temporary one under
// $TMPDIR, or under $TESSERA_BENCH_DIR when set (e.g. /dev/shm, to take
// the disk out).
func benchDir(b *testing.B) string {
	base := os.Getenv("TESSERA_BENCH_DIR")
	if base == "" {
		return tempDir(b)
	}
	dir, err := os.MkdirTemp(base, "tsr")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
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
