package scale

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/pprof/profile"
)

// profileChunk is how long each CPU profile a run takes lasts: a workload
// is profiled by back-to-back chunks until it ends, merged afterwards.
const profileChunk = 5 * time.Second

// Profiled are the components whose CPU a run profiles (their
// /debug/pprof, on by default in both).
var Profiled = []string{"apiserver", "scheduler"}

// Hotspot is a function's share of a profile.
type Hotspot struct {
	Function string
	// Flat is the share of samples in the function itself, Cum the share
	// with the function anywhere on the stack.
	Flat, Cum float64
}

// Area is the share of a profile's samples whose stack holds a function
// of one of Prefixes (a package path or a function name's prefix).
type Area struct {
	Name     string
	Prefixes []string
}

// Areas are what a profile summary reports shares of: the DRA allocator
// and the scheduler's DRA plugin, admission (CEL and webhooks included),
// encoding and decoding, storage (etcd and the watch cache) and the
// garbage collector.
var Areas = []Area{
	{"DRA allocator", []string{"k8s.io/dynamic-resource-allocation/structured"}},
	{"scheduler DRA plugin (allocator included)", []string{"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"}},
	{"admission", []string{"k8s.io/apiserver/pkg/admission"}},
	{"encode/decode", []string{"encoding/json", "k8s.io/apimachinery/pkg/runtime/serializer", "sigs.k8s.io/json", "google.golang.org/protobuf", "k8s.io/apimachinery/pkg/util/managedfields", "sigs.k8s.io/structured-merge-diff"}},
	{"storage (etcd client, watch cache)", []string{"k8s.io/apiserver/pkg/storage", "go.etcd.io/etcd"}},
	{"garbage collector", []string{"runtime.gcBgMarkWorker", "runtime.gcAssist", "runtime.mallocgc"}},
}

// ProfileSummary summarises the CPU profile of one component during one
// workload.
type ProfileSummary struct {
	// Seconds is the CPU time the profile sampled.
	Seconds float64
	// Top are the functions with the most flat samples, most first,
	// outside the Go runtime and system calls; Runtime is the share of
	// flat samples those hold (the garbage collector's among them).
	Top     []Hotspot
	Runtime float64
	// Areas are the shares of Areas, in order.
	Areas []float64
	// File is the merged profile (go tool pprof reads it).
	File string
}

// profiler takes back-to-back CPU profiles of endpoints until stopped.
type profiler struct {
	eps  []endpoint
	dir  string
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	raw  map[string][]*profile.Profile
	errs []error
}

func startProfiler(ctx context.Context, eps []endpoint, dir string) *profiler {
	p := &profiler{eps: eps, dir: dir, stop: make(chan struct{}), raw: map[string][]*profile.Profile{}}
	for _, ep := range eps {
		p.wg.Go(func() {
			for {
				select {
				case <-p.stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				prof, err := fetchProfile(ctx, ep, profileChunk)
				p.mu.Lock()
				if err != nil {
					p.errs = append(p.errs, err)
				} else {
					p.raw[ep.name] = append(p.raw[ep.name], prof)
				}
				p.mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	return p
}

// finish waits for the chunks under way, merges each endpoint's and
// summarises it; the merged profiles go to dir as NAME-WORKLOAD.pb.gz.
func (p *profiler) finish(workload string) (map[string]ProfileSummary, error) {
	close(p.stop)
	p.wg.Wait()
	if len(p.errs) > 0 {
		return nil, p.errs[0]
	}
	out := map[string]ProfileSummary{}
	for name, chunks := range p.raw {
		merged, err := profile.Merge(chunks)
		if err != nil {
			return nil, fmt.Errorf("merging the %s profiles: %w", name, err)
		}
		s := summarise(merged, 8)
		s.File = filepath.Join(p.dir, fmt.Sprintf("%s-%s.pb.gz", name, workload))
		f, err := os.Create(s.File)
		if err != nil {
			return nil, err
		}
		err = merged.Write(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, err
		}
		out[name] = s
	}
	return out, nil
}

// fetchProfile takes one CPU profile of d from ep's /debug/pprof.
func fetchProfile(ctx context.Context, ep endpoint, d time.Duration) (*profile.Profile, error) {
	url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", strings.TrimSuffix(ep.url, "/metrics"), int(d.Seconds()))
	body, err := ep.get(ctx, url, d+30*time.Second)
	if err != nil {
		return nil, err
	}
	return profile.Parse(bytes.NewReader(body))
}

// summarise reads a CPU profile's top functions (flat) and area shares.
func summarise(p *profile.Profile, top int) ProfileSummary {
	vi := len(p.SampleType) - 1 // cpu nanoseconds follow the sample count
	for i, st := range p.SampleType {
		if st.Type == "cpu" {
			vi = i
		}
	}
	var total int64
	flat, cum := map[string]int64{}, map[string]int64{}
	area := make([]int64, len(Areas))
	for _, s := range p.Sample {
		v := s.Value[vi]
		total += v
		seen := map[string]bool{}
		inArea := make([]bool, len(Areas))
		for li, loc := range s.Location {
			// Inlined functions share a location; the last line is the
			// outermost. The leaf of the leaf location is the flat one.
			for j := range loc.Line {
				fn := loc.Line[j].Function
				if fn == nil {
					continue
				}
				if li == 0 && j == 0 {
					flat[fn.Name] += v
				}
				if !seen[fn.Name] {
					seen[fn.Name] = true
					cum[fn.Name] += v
				}
				for ai, a := range Areas {
					for _, pre := range a.Prefixes {
						if strings.HasPrefix(fn.Name, pre) {
							inArea[ai] = true
						}
					}
				}
			}
		}
		for ai, in := range inArea {
			if in {
				area[ai] += v
			}
		}
	}
	s := ProfileSummary{Seconds: float64(total) / 1e9}
	if total == 0 {
		return s
	}
	for fn, v := range flat {
		if isRuntime(fn) {
			s.Runtime += float64(v) / float64(total)
			continue
		}
		s.Top = append(s.Top, Hotspot{Function: fn, Flat: float64(v) / float64(total), Cum: float64(cum[fn]) / float64(total)})
	}
	sort.Slice(s.Top, func(i, j int) bool {
		if s.Top[i].Flat != s.Top[j].Flat {
			return s.Top[i].Flat > s.Top[j].Flat
		}
		return s.Top[i].Function < s.Top[j].Function
	})
	if len(s.Top) > top {
		s.Top = s.Top[:top]
	}
	for _, v := range area {
		s.Areas = append(s.Areas, float64(v)/float64(total))
	}
	return s
}

// isRuntime says whether fn belongs to the Go runtime or makes system calls.
func isRuntime(fn string) bool {
	for _, pre := range []string{"runtime.", "internal/runtime/", "syscall.", "internal/syscall/", "golang.org/x/sys/", "internal/poll.", "sync/atomic.", "internal/sync.", "sync.", "aeshash", "memeqbody", "indexbytebody", "cmpbody"} {
		if strings.HasPrefix(fn, pre) {
			return true
		}
	}
	return false
}
