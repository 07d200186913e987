package procusage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-dev/tessera/pkg/gpu/discover"
	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
	"github.com/tessera-dev/tessera/pkg/node/mig"
)

// fakeProc writes /proc/<pid>/cgroup files: pod processes for the PIDs in
// pods (PID -> pod UID), and nothing for others (gone, or not readable).
func fakeProc(t testing.TB, pods map[uint32]string) string {
	root := t.TempDir()
	for pid, uid := range pods {
		dir := filepath.Join(root, strconv.FormatUint(uint64(pid), 10))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		content := "0::/system.slice/sshd.service\n"
		if uid != "" {
			content = fmt.Sprintf("0::/kubepods/burstable/pod%s/%064x\n", uid, pid)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func mockServer(t testing.TB, profile string, migEnabled bool) *nvmlmock.Server {
	spec, err := nvmlmock.ParseProfile(profile)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := nvmlmock.New(nvmlmock.Options{Spec: spec, Seed: "node", MIGEnabled: migEnabled})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

func TestSample(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	srv := mockServer(t, "t4:1,a100-40gb", true)
	t4, a100 := srv.Devices()[0].UUID, srv.Devices()[1].UUID
	inv, err := discover.Discover(ctx, srv)
	if err != nil {
		t.Fatal(err)
	}
	var prof inventory.MIGProfile
	for _, p := range inv.GPUs[1].MIGProfiles {
		if p.Name == "3g.20gb" {
			prof = p
		}
	}
	tmpl, err := mig.Template(inv.GPUs[1], prof, 4)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := mig.New(srv).Create(ctx, tmpl, nil)
	if err != nil {
		t.Fatal(err)
	}
	const podA, podB = "aaaaaaaa-0000-0000-0000-000000000001", "bbbbbbbb-0000-0000-0000-000000000002"
	srv.SetProcesses(t4, []nvmlmock.Process{{PID: 10, UsedMemory: 1 << 30, SMUtil: 40}, {PID: 11, UsedMemory: 512 << 20, SMUtil: 150}, {PID: 12, UsedMemory: 64 << 20}, {PID: 13, UsedMemory: 1 << 20}})
	srv.SetProcesses(inst.UUID, []nvmlmock.Process{{PID: 20, UsedMemory: 2 << 30}})
	root := fakeProc(t, map[uint32]string{10: podA, 11: podA, 12: "", 20: podB}) // 13 is gone
	s := NewSampler(srv, root)
	got, err := s.Sample(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.GPUs) != 2 {
		t.Fatalf("%d GPUs, want 2", len(got.GPUs))
	}
	byPID := map[uint32]Process{}
	for _, p := range got.Processes {
		byPID[p.PID] = p
	}
	for _, tc := range []struct {
		pid         uint32
		device, gpu string
		mem         uint64
		sm          int
		pod         string
	}{
		{10, t4, t4, 1 << 30, 40, podA},
		{11, t4, t4, 512 << 20, 100, podA}, // capped
		{12, t4, t4, 64 << 20, 0, ""},      // a host process
		{13, t4, t4, 1 << 20, 0, ""},       // gone before it was looked up
		{20, inst.UUID, a100, 2 << 30, 0, podB},
	} {
		p, ok := byPID[tc.pid]
		if !ok {
			t.Errorf("pid %d missing from the sample", tc.pid)
			continue
		}
		if p.Device != tc.device || p.GPU != tc.gpu || p.UsedMemory != tc.mem || p.SMUtil != tc.sm || p.Owner.PodUID != tc.pod || p.Owned != (tc.pod != "") {
			t.Errorf("pid %d: %+v; want device %s gpu %s memory %d SM %d pod %q", tc.pid, p, tc.device, tc.gpu, tc.mem, tc.sm, tc.pod)
		}
	}
	if len(got.Processes) != 5 {
		t.Errorf("%d processes, want 5 (a MIG GPU's processes are counted once, per MIG device)", len(got.Processes))
	}
}

// BenchmarkSample is one sampling pass over 8 GPUs with 100 compute
// processes in steady state (the processes of the last pass keep their
// owners; the target is under 5 ms per pass). BenchmarkSampleCold looks every
// process up in /proc, as the first pass after a start does.
func BenchmarkSample(b *testing.B)     { benchmarkSample(b, false) }
func BenchmarkSampleCold(b *testing.B) { benchmarkSample(b, true) }

func benchmarkSample(b *testing.B, cold bool) {
	srv := mockServer(b, "t4:8", false)
	pods := map[uint32]string{}
	for g, d := range srv.Devices() {
		var procs []nvmlmock.Process
		for i := range 100 / 8 {
			pid := uint32(1000 + g*100 + i)
			procs = append(procs, nvmlmock.Process{PID: pid, UsedMemory: 1 << 30, SMUtil: 10})
			pods[pid] = fmt.Sprintf("%08x-0000-0000-0000-%012x", g, i)
		}
		if g < 100%8 {
			pid := uint32(1000 + g*100 + 99)
			procs = append(procs, nvmlmock.Process{PID: pid, UsedMemory: 1 << 30})
			pods[pid] = fmt.Sprintf("%08x-0000-0000-0000-%012x", g, 99)
		}
		srv.SetProcesses(d.UUID, procs)
	}
	root := fakeProc(b, pods)
	s := NewSampler(srv, root)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if cold {
			s = NewSampler(srv, root)
		}
		got, err := s.Sample(ctx)
		if err != nil || len(got.Processes) != 100 {
			b.Fatalf("%v processes, %v", len(got.Processes), err)
		}
	}
}

// A PID that leaves NVML's list is forgotten: if a new process in another
// pod takes it later, it gets its own owner.
func TestSampleForgetsPIDsThatLeave(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	srv := mockServer(t, "t4:1", false)
	gpu := srv.Devices()[0].UUID
	const podA, podB = "aaaaaaaa-0000-0000-0000-000000000001", "bbbbbbbb-0000-0000-0000-000000000002"
	root := fakeProc(t, map[uint32]string{42: podA})
	s := NewSampler(srv, root)
	owner := func() string {
		t.Helper()
		got, err := s.Sample(ctx)
		if err != nil || len(got.Processes) != 1 {
			t.Fatalf("%v, %v", got, err)
		}
		return got.Processes[0].Owner.PodUID
	}
	srv.SetProcesses(gpu, []nvmlmock.Process{{PID: 42, UsedMemory: 1}})
	if got := owner(); got != podA {
		t.Fatalf("owner %s, want %s", got, podA)
	}
	// The process ends (one pass without it); PID 42 comes back in pod B.
	srv.SetProcesses(gpu, nil)
	if _, err := s.Sample(ctx); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "42", "cgroup"), []byte("0::/kubepods/pod"+podB+"/"+strings.Repeat("b", 64)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv.SetProcesses(gpu, []nvmlmock.Process{{PID: 42, UsedMemory: 1}})
	if got := owner(); got != podB {
		t.Errorf("reused PID attributed to %s, want %s", got, podB)
	}
}
