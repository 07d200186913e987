package scale

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// fakeProc writes a /proc fixture: pid → argv0, utime, stime, VmRSS kB.
type fakeProc struct {
	argv0        string
	utime, stime int
	rssKB        int
	kernelThread bool
}

func writeProc(t *testing.T, root string, procs map[int]fakeProc) {
	t.Helper()
	for pid, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		cmdline := p.argv0 + "\x00--flag\x00"
		if p.kernelThread {
			cmdline = ""
		}
		// The command may hold spaces and parentheses.
		stat := strconv.Itoa(pid) + " (odd) name) S 1 1 1 0 -1 4194560 100 0 0 0 " +
			strconv.Itoa(p.utime) + " " + strconv.Itoa(p.stime) + " 0 0 20 0 8 0 1 1 1\n"
		status := "Name:\todd\nVmPeak:\t 9 kB\nVmRSS:\t  " + strconv.Itoa(p.rssKB) + " kB\nThreads:\t8\n"
		for name, data := range map[string]string{"cmdline": cmdline, "stat": stat, "status": status} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestProcSampler(t *testing.T) {
	root := t.TempDir()
	writeProc(t, root, map[int]fakeProc{
		10: {argv0: "/usr/local/bin/kube-apiserver", utime: 100, stime: 50, rssKB: 1000},
		11: {argv0: "/usr/bin/controller", utime: 10, stime: 0, rssKB: 300},
		12: {argv0: "/usr/bin/controller", utime: 20, stime: 0, rssKB: 200}, // a second replica
		13: {argv0: "/usr/bin/kube-controller-manager-not", utime: 1, stime: 1, rssKB: 1},
		14: {kernelThread: true},
	})
	if err := os.WriteFile(filepath.Join(root, "self"), nil, 0o644); err != nil { // not a pid
		t.Fatal(err)
	}
	s := newProcSampler(root, []string{"kube-apiserver", "controller", "kube-controller-manager"})
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	// Later: the API server used 2.5 s more and grew, then shrank; the
	// second controller replica exited.
	writeProc(t, root, map[int]fakeProc{10: {argv0: "kube-apiserver", utime: 300, stime: 100, rssKB: 4000}})
	time.Sleep(3 * sampleEvery)
	writeProc(t, root, map[int]fakeProc{10: {argv0: "kube-apiserver", utime: 300, stime: 100, rssKB: 2000}})
	if err := os.RemoveAll(filepath.Join(root, "12")); err != nil {
		t.Fatal(err)
	}
	writeProc(t, root, map[int]fakeProc{11: {argv0: "controller", utime: 60, stime: 10, rssKB: 300}})
	got := s.finish()
	want := map[string]Usage{
		"kube-apiserver": {CPU: 2500 * time.Millisecond, PeakRSS: 4000 * 1024},
		"controller":     {CPU: 600 * time.Millisecond, PeakRSS: 500 * 1024},
	}
	if len(got) != len(want) {
		t.Errorf("components %v, want %v", got, want)
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: %+v, want %+v", name, got[name], w)
		}
	}
	if order := sortedComponents(got); len(order) != 2 || order[0] != "kube-apiserver" || order[1] != "controller" {
		t.Errorf("sortedComponents = %v, want Components' order", order)
	}
}

func TestCPUTicksRefusesMalformedStat(t *testing.T) {
	root := t.TempDir()
	for pid, stat := range map[int]string{1: "1 no parenthesis S 1", 2: "2 (x) S 1 2 3", 3: "3 (x) S 1 1 1 0 -1 0 0 0 0 0 u s"} {
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := cpuTicks(root, pid); err == nil {
			t.Errorf("cpuTicks(%q) = nil error, want one", stat)
		}
	}
}

func TestSummarise(t *testing.T) {
	fn := func(id uint64, name string) *profile.Function { return &profile.Function{ID: id, Name: name} }
	alloc := fn(1, "k8s.io/dynamic-resource-allocation/structured/internal/experimental.(*Allocator).Allocate")
	plugin := fn(2, "k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources.(*DynamicResources).Filter")
	gc := fn(3, "runtime.gcBgMarkWorker")
	enc := fn(4, "encoding/json.Marshal")
	loc := func(id uint64, fns ...*profile.Function) *profile.Location {
		l := &profile.Location{ID: id}
		for _, f := range fns {
			l.Line = append(l.Line, profile.Line{Function: f})
		}
		return l
	}
	lAlloc, lPlugin, lGC := loc(1, alloc), loc(2, plugin), loc(3, gc)
	lInlined := loc(4, enc, plugin) // json inlined into the plugin
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		Sample: []*profile.Sample{
			{Location: []*profile.Location{lAlloc, lPlugin}, Value: []int64{6, 6e9}},
			{Location: []*profile.Location{lPlugin}, Value: []int64{1, 1e9}},
			{Location: []*profile.Location{lInlined}, Value: []int64{1, 1e9}},
			{Location: []*profile.Location{lGC}, Value: []int64{2, 2e9}},
		},
		Function: []*profile.Function{alloc, plugin, gc, enc},
		Location: []*profile.Location{lAlloc, lPlugin, lGC, lInlined},
	}
	s := summarise(p, 3)
	if s.Seconds != 10 {
		t.Errorf("Seconds = %v, want 10", s.Seconds)
	}
	wantTop := []Hotspot{{alloc.Name, 0.6, 0.6}, {enc.Name, 0.1, 0.1}, {plugin.Name, 0.1, 0.8}}
	if s.Runtime != 0.2 {
		t.Errorf("Runtime = %v, want 0.2 (the collector)", s.Runtime)
	}
	if len(s.Top) != len(wantTop) {
		t.Fatalf("Top = %+v, want %+v", s.Top, wantTop)
	}
	for i, w := range wantTop {
		if s.Top[i] != w {
			t.Errorf("Top[%d] = %+v, want %+v", i, s.Top[i], w)
		}
	}
	wantAreas := map[string]float64{"DRA allocator": 0.6, "scheduler DRA plugin (allocator included)": 0.8, "encode/decode": 0.1, "garbage collector": 0.2, "admission": 0}
	for i, a := range Areas {
		if w, ok := wantAreas[a.Name]; ok && s.Areas[i] != w {
			t.Errorf("area %s = %v, want %v", a.Name, s.Areas[i], w)
		}
	}
}

func TestWithFlags(t *testing.T) {
	args := []string{"--leader-elect=true", "--pin-nodes=all", "--v", "4"}
	tests := []struct {
		name  string
		flags map[string]string
		want  []string
	}{
		{"nil keeps the chart's", nil, args},
		{"replaces in place", map[string]string{"--pin-nodes": "none"}, []string{"--leader-elect=true", "--pin-nodes=none", "--v", "4"}},
		{"appends a missing one, in name order", map[string]string{"--z": "1", "--cycle-interval": "1s"}, append(append([]string(nil), args...), "--cycle-interval=1s", "--z=1")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := withFlags(args, tc.flags)
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("withFlags = %q, want %q", got, tc.want)
			}
		})
	}
	if args[1] != "--pin-nodes=all" {
		t.Error("withFlags changed its argument")
	}
}
