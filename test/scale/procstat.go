package scale

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tessera-dev/tessera/test/localcluster"
)

// Components are the processes a scale run accounts CPU time and memory
// to, by the base name of their executable: the control plane, the node
// (kubelet, containerd), Tessera's controller (its webhooks run in the
// same process) and kubelet plugin, the kwok controller and, for the peer
// comparison, the Kueue manager.
var Components = []string{"kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager", "controller", "kubelet-plugin", "kubelet", "containerd", "kwok", "kueue"}

// userHZ is the unit of utime and stime in /proc/PID/stat: USER_HZ,
// which Linux fixes at 100 for every architecture user space sees.
const userHZ = 100

// Usage is what one component's processes used during a workload.
type Usage struct {
	// CPU is user plus system time of its processes.
	CPU time.Duration
	// PeakRSS is the highest sum of its processes' resident memory seen
	// (sampled every sampleEvery).
	PeakRSS uint64
}

const sampleEvery = 250 * time.Millisecond

// procSampler follows the components' processes through /proc from start
// to stop: CPU time as the difference of the two readings, resident
// memory sampled in between.
type procSampler struct {
	root  string // "/proc", a fixture in tests
	names []string

	mu    sync.Mutex
	pids  map[int]string // pid → component
	first map[int]uint64 // pid → CPU ticks at start
	peak  map[string]uint64
	stop  chan struct{}
	done  chan struct{}
}

func newProcSampler(root string, names []string) *procSampler {
	return &procSampler{root: root, names: names}
}

// start finds the components' processes, reads their CPU time and samples
// their memory until stop.
func (s *procSampler) start() error {
	pids, err := findProcesses(s.root, s.names)
	if err != nil {
		return err
	}
	s.pids, s.first, s.peak = pids, map[int]uint64{}, map[string]uint64{}
	for pid := range pids {
		if t, err := cpuTicks(s.root, pid); err == nil {
			s.first[pid] = t
		}
	}
	s.sample()
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(s.done)
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				s.sample()
			}
		}
	}()
	return nil
}

// sample adds up each component's resident memory now and keeps the peak.
func (s *procSampler) sample() {
	sum := map[string]uint64{}
	for pid, name := range s.pids {
		if rss, err := residentBytes(s.root, pid); err == nil {
			sum[name] += rss
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, v := range sum {
		s.peak[name] = max(s.peak[name], v)
	}
}

// finish stops sampling and returns each component's usage. A process
// that exited in between counts nothing for its CPU time (a restart during
// a run shows as a drop).
func (s *procSampler) finish() map[string]Usage {
	close(s.stop)
	<-s.done
	s.sample()
	out := map[string]Usage{}
	for pid, name := range s.pids {
		u := out[name]
		if t0, ok := s.first[pid]; ok {
			if t1, err := cpuTicks(s.root, pid); err == nil && t1 >= t0 {
				u.CPU += time.Duration(t1-t0) * time.Second / userHZ
			}
		}
		out[name] = u
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, peak := range s.peak {
		u := out[name]
		u.PeakRSS = peak
		out[name] = u
	}
	return out
}

// findProcesses maps the pid of every process whose executable's base name
// (argv[0]) is one of names to that name.
func findProcesses(root string, names []string) (map[int]string, error) {
	procs, err := localcluster.Processes(root)
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for pid, args := range procs {
		if name := filepath.Base(args[0]); slices.Contains(names, name) {
			out[pid] = name
		}
	}
	return out, nil
}

// cpuTicks is utime + stime of pid, fields 14 and 15 of /proc/PID/stat
// (counted after the command, which is in parentheses and may hold spaces).
func cpuTicks(root string, pid int) (uint64, error) {
	data, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("pid %d: malformed stat %q", pid, data)
	}
	// After ") ": field 3 (state) is fields[0]; utime (14) is fields[11].
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("pid %d: stat has %d fields after the command", pid, len(fields))
	}
	utime, err := strconv.ParseUint(fields[11], 10, 64)
	if err != nil {
		return 0, err
	}
	stime, err := strconv.ParseUint(fields[12], 10, 64)
	if err != nil {
		return 0, err
	}
	return utime + stime, nil
}

// residentBytes is VmRSS of /proc/PID/status.
func residentBytes(root string, pid int) (uint64, error) {
	data, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("pid %d: VmRSS %q", pid, rest)
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		return kb * 1024, err
	}
	return 0, fmt.Errorf("pid %d: no VmRSS (a kernel thread or a zombie)", pid)
}

// sortedComponents lists the components in usage in Components' order,
// then any other.
func sortedComponents(usage map[string]Usage) []string {
	var out []string
	seen := map[string]bool{}
	for _, n := range Components {
		if _, ok := usage[n]; ok {
			out, seen[n] = append(out, n), true
		}
	}
	var rest []string
	for n := range usage {
		if !seen[n] {
			rest = append(rest, n)
		}
	}
	sort.Strings(rest)
	return append(out, rest...)
}
