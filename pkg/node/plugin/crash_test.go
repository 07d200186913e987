package plugin

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/gpu/nvmlmock"
	"github.com/tessera-dev/tessera/pkg/node/cdispec"
	"github.com/tessera-dev/tessera/pkg/node/prepare"
	"github.com/tessera-dev/tessera/pkg/node/timeslice"
)

// The crash-injection test runs the plugin as a separate process: this
// test binary re-executed with crashChildEnv naming the node directory.
const (
	crashChildEnv = "TESSERA_CRASHTEST_CHILD"
	// crashIterationsEnv overrides the number of crashes (default 200,
	// 40 with -short); crashSeedEnv the random seed.
	crashIterationsEnv = "TESSERA_CRASH_ITERATIONS"
	crashSeedEnv       = "TESSERA_CRASH_SEED"
	// crashAtFile arms a crash in the child: "<point> <n>" kills it with
	// SIGKILL at the n-th time it passes the point.
	crashAtFile = "crash-at"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		os.Exit(runCrashChild(dir))
	}
	os.Exit(m.Run())
}

type crashConfig struct {
	Profile    string                      `json:"profile"`
	MIG        bool                        `json:"mig"`
	TimeSlices map[string]int              `json:"timeSlices"`
	Claims     []resourceapi.ResourceClaim `json:"claims"`
}

// runCrashChild is the plugin process: the real plugin over the node
// directory, a fake API server holding the claims, and a crash hook.
func runCrashChild(dir string) int {
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var cfg crashConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	opts := nodeOptions(dir, cfg.Profile, cfg.MIG, cfg.TimeSlices)
	hits := map[string]int{}
	var mu sync.Mutex
	opts.crash = func(point string) {
		armed, err := os.ReadFile(filepath.Join(dir, crashAtFile))
		if err != nil {
			return
		}
		fields := strings.Fields(string(armed))
		if len(fields) != 2 || fields[0] != point {
			return
		}
		n, _ := strconv.Atoi(fields[1])
		mu.Lock()
		hits[point]++
		hit := hits[point] >= n
		mu.Unlock()
		if hit {
			fmt.Fprintf(os.Stderr, "crash-test child: SIGKILL at %s\n", point)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	objs := []runtime.Object{nodeObject()}
	for i := range cfg.Claims {
		objs = append(objs, &cfg.Claims[i])
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	d, err := Start(ctx, opts, newLightFakeClient(objs...))
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash-test child:", err)
		return 1
	}
	fmt.Println("READY")
	<-ctx.Done()
	d.Stop()
	return 0
}

// child is one plugin process.
type child struct {
	cmd  *exec.Cmd
	dra  drapb.DRAPluginClient
	conn *grpc.ClientConn
	done chan struct{}
}

func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
	_ = c.conn.Close()
}

func (c *child) alive() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// kubeletOp is a call the kubelet makes and must see succeed.
type kubeletOp struct {
	unprepare bool
	claims    []*resourceapi.ResourceClaim
}

func (o kubeletOp) String() string {
	var names []string
	for _, c := range o.claims {
		names = append(names, c.Name)
	}
	if o.unprepare {
		return "unprepare " + strings.Join(names, ",")
	}
	return "prepare " + strings.Join(names, ",")
}

// preparedClaim is what the kubelet got for a claim.
type preparedClaim struct {
	ids     []string
	visible string
}

type crashTest struct {
	t       *testing.T
	dir     string
	opts    *Options
	claims  []*resourceapi.ResourceClaim
	rng     *rand.Rand
	log     *os.File
	model   map[string]preparedClaim
	crashes map[string]int
	// tsGPU is the UUID of the time-sliced GPU.
	tsGPU string
}

// TestCrashInjection SIGKILLs the plugin process at random points of
// prepare and unprepare, hundreds of times, on one long-lived node: at
// named crash points (armed through a file the child reads) and after
// random delays. After every crash it restarts the plugin, replays the
// kubelet call that failed and checks that no CDI spec, MIG instance,
// accounting directory or checkpoint leaked or went missing, that the
// GPU's time slice matches the claims that hold it, and that no claim
// was ever prepared twice with different devices.
func TestCrashInjection(t *testing.T) {
	iterations := 200
	if testing.Short() {
		iterations = 40
	}
	if v, err := strconv.Atoi(os.Getenv(crashIterationsEnv)); err == nil {
		iterations = v
	}
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv(crashSeedEnv), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (%s=%d to repeat), %d crashes", seed, crashSeedEnv, seed, iterations)
	dir := tempDir(t)
	ct := &crashTest{t: t, dir: dir, rng: rand.New(rand.NewPCG(seed, seed)), model: map[string]preparedClaim{}, crashes: map[string]int{}}
	ct.claims = []*resourceapi.ResourceClaim{
		withGpuConfig(newClaim("s1", shareResult("gpu", "gpu-0", "share-1", gib, 0)), nil, `"enforcement":"interposer"`),
		newClaim("s2", shareResult("gpu", "gpu-0", "share-2", 2*gib, 50)),
		newClaim("s3", shareResult("gpu", "gpu-0", "share-3", gib, 20)),
		newClaim("w1", deviceResult("gpu", "gpu-1")),
		withGpuConfig(newClaim("t1", deviceResult("ts", "gpu-2-ts-0")), nil, `"timeSliceInterval":"Long"`),
		withGpuConfig(newClaim("t2", deviceResult("ts", "gpu-2-ts-1")), nil, `"timeSliceInterval":"Long"`),
		newClaim("m1", deviceResult("mig", "gpu-3-mig-1g5gb-0")),
		newClaim("m2", deviceResult("mig", "gpu-3-mig-2g10gb-2")),
		newClaim("m3", deviceResult("mig", "gpu-3-mig-3g20gb-4")),
		newClaim("x1", shareResult("gpu", "gpu-0", "share-4", 512<<20, 0), deviceResult("mig", "gpu-3-mig-1g5gb-1")),
	}
	cfg := crashConfig{Profile: "t4:3,a100-40gb", MIG: true, TimeSlices: map[string]int{"2": 2}}
	for _, c := range ct.claims {
		cfg.Claims = append(cfg.Claims, *c)
	}
	data, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	ct.opts = nodeOptions(dir, cfg.Profile, cfg.MIG, cfg.TimeSlices)
	spec, err := nvmlmock.ParseProfile(cfg.Profile)
	if err != nil {
		t.Fatal(err)
	}
	mock, err := nvmlmock.New(nvmlmock.Options{Spec: spec, Seed: testNode})
	if err != nil {
		t.Fatal(err)
	}
	ct.tsGPU = mock.Devices()[2].UUID
	log, err := os.Create(filepath.Join(dir, "child.log"))
	if err != nil {
		t.Fatal(err)
	}
	ct.log = log
	defer log.Close()
	defer func() {
		if t.Failed() {
			data, _ := os.ReadFile(log.Name())
			if len(data) > 8000 {
				data = data[len(data)-8000:]
			}
			t.Logf("tail of the plugin's log:\n%s", data)
		}
	}()

	var inflight *kubeletOp
	start := time.Now()
	for i := 0; i < iterations && !t.Failed(); i++ {
		c := ct.startChild(i)
		if c == nil {
			continue // killed while starting up: also a crash
		}
		if inflight != nil {
			if err := ct.do(c, *inflight); err != nil {
				c.kill()
				t.Fatalf("crash %d: replaying %s after restart: %v", i, inflight, err)
			}
		}
		ct.verify(i)
		inflight = ct.crashOnce(c, i)
	}
	// Finally: replay, unprepare everything, nothing may be left.
	c := ct.startChild(-1)
	if c == nil {
		t.Fatal("final start failed")
	}
	defer c.kill()
	if inflight != nil {
		if err := ct.do(c, *inflight); err != nil {
			t.Fatalf("final replay of %s: %v", inflight, err)
		}
	}
	ct.verify(iterations)
	if err := ct.do(c, kubeletOp{unprepare: true, claims: ct.claims}); err != nil {
		t.Fatal(err)
	}
	ct.verify(iterations + 1)
	var points []string
	for p, n := range ct.crashes {
		points = append(points, fmt.Sprintf("%s=%d", p, n))
	}
	sort.Strings(points)
	t.Logf("%d crashes in %s: %s", iterations, time.Since(start).Round(time.Millisecond), strings.Join(points, " "))
}

// startChild starts the plugin and waits until it serves. It returns nil
// when the test killed it during start-up on purpose.
func (ct *crashTest) startChild(i int) *child {
	t := ct.t
	t.Helper()
	_ = os.Remove(filepath.Join(ct.dir, crashAtFile))
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+ct.dir)
	cmd.Stderr = ct.log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(ct.log, "=== start %d\n", i)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		ok := false
		for sc.Scan() {
			if sc.Text() == "READY" {
				ok = true
				break
			}
		}
		ready <- ok
		for sc.Scan() {
		}
		_ = cmd.Wait()
		close(c.done)
	}()
	// Now and then kill it while it recovers.
	if i >= 0 && ct.rng.IntN(10) == 0 {
		time.Sleep(time.Duration(ct.rng.IntN(30)) * time.Millisecond)
		_ = cmd.Process.Kill()
		<-c.done
		ct.crashes["start-up"]++
		return nil
	}
	select {
	case ok := <-ready:
		if !ok {
			<-c.done
			t.Fatalf("start %d: the plugin exited before serving (see %s)", i, ct.log.Name())
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("start %d: the plugin did not serve within a minute", i)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(ct.opts.PluginDataDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	c.conn, c.dra = conn, drapb.NewDRAPluginClient(conn)
	return c
}

// crashOnce arms a crash, runs random kubelet calls until the plugin dies
// and returns the call that was interrupted (nil if it died between calls).
func (ct *crashTest) crashOnce(c *child, i int) *kubeletOp {
	t := ct.t
	named := ct.rng.IntN(10) < 6
	var timer *time.Timer
	if named {
		point := prepare.CrashPoints[ct.rng.IntN(len(prepare.CrashPoints))]
		n := 1 + ct.rng.IntN(2)
		if err := os.WriteFile(filepath.Join(ct.dir, crashAtFile), fmt.Appendf(nil, "%s %d", point, n), 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(ct.log, "=== crash %d armed at %s #%d\n", i, point, n)
	} else {
		delay := time.Duration(ct.rng.IntN(6000)) * time.Microsecond
		fmt.Fprintf(ct.log, "=== crash %d after %s\n", i, delay)
		timer = time.AfterFunc(delay, func() { _ = c.cmd.Process.Kill() })
		defer timer.Stop()
	}
	for range 40 {
		op := ct.randomOp()
		err := ct.do(c, op)
		if err == nil {
			continue
		}
		if c.alive() {
			// Give a dying process a moment before calling it a failure.
			select {
			case <-c.done:
			case <-time.After(5 * time.Second):
				c.kill()
				t.Fatalf("crash %d: %s failed but the plugin lives: %v", i, op, err)
			}
		}
		_ = c.conn.Close()
		ct.crashes[ct.reason(named)]++
		return &op
	}
	// The armed point was not on the path of these calls: kill it idle.
	c.kill()
	ct.crashes["idle"]++
	return nil
}

func (ct *crashTest) reason(named bool) string {
	if !named {
		return "timed"
	}
	data, _ := os.ReadFile(filepath.Join(ct.dir, crashAtFile))
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return "named"
	}
	return f[0]
}

func (ct *crashTest) randomOp() kubeletOp {
	pick := func() *resourceapi.ResourceClaim { return ct.claims[ct.rng.IntN(len(ct.claims))] }
	claims := []*resourceapi.ResourceClaim{pick()}
	if ct.rng.IntN(5) == 0 {
		if other := pick(); other != claims[0] {
			claims = append(claims, other)
		}
	}
	_, prepared := ct.model[string(claims[0].UID)]
	return kubeletOp{unprepare: prepared && ct.rng.IntN(10) < 7, claims: claims}
}

// do makes one kubelet call. A transport error is returned; a claim
// error fails the test (these claims never conflict).
func (ct *crashTest) do(c *child, op kubeletOp) error {
	t := ct.t
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if op.unprepare {
		resp, err := c.dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: pbClaims(op.claims...)})
		if err != nil {
			return err
		}
		for _, cl := range op.claims {
			if e := resp.Claims[string(cl.UID)].GetError(); e != "" {
				t.Fatalf("%s: %s", op, e)
			}
			delete(ct.model, string(cl.UID))
		}
		return nil
	}
	resp, err := c.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: pbClaims(op.claims...)})
	if err != nil {
		return err
	}
	for _, cl := range op.claims {
		r := resp.Claims[string(cl.UID)]
		if r.GetError() != "" {
			t.Fatalf("%s: claim %s: %s", op, cl.Name, r.GetError())
		}
		var ids []string
		for _, d := range r.Devices {
			ids = append(ids, d.CdiDeviceIds...)
		}
		got := preparedClaim{ids: ids, visible: ct.visible(cl)}
		if prev, ok := ct.model[string(cl.UID)]; ok {
			if !slices.Equal(prev.ids, got.ids) || prev.visible != got.visible {
				t.Fatalf("claim %s prepared twice with different devices: %v %s, then %v %s", cl.Name, prev.ids, prev.visible, got.ids, got.visible)
			}
		}
		ct.model[string(cl.UID)] = got
	}
	return nil
}

// visible reads NVIDIA_VISIBLE_DEVICES from a claim's spec.
func (ct *crashTest) visible(cl *resourceapi.ResourceClaim) string {
	spec, err := cdispec.Dir{Path: ct.opts.CDIRoot}.Read(cdispec.SpecName(string(cl.UID)))
	if err != nil {
		ct.t.Fatalf("claim %s prepared but its spec is unreadable: %v", cl.Name, err)
	}
	for _, e := range spec.ContainerEdits.Env {
		if v, ok := strings.CutPrefix(e, "NVIDIA_VISIBLE_DEVICES="); ok {
			return v
		}
	}
	return ""
}

// verify compares the node with what the kubelet believes is prepared.
func (ct *crashTest) verify(i int) {
	t := ct.t
	t.Helper()
	var want []string
	wantMIG := map[int]bool{}
	wantInterval := v1Default
	for uid, p := range ct.model {
		want = append(want, uid)
		if got := ct.visibleByUID(uid); got != p.visible {
			t.Errorf("after crash %d: claim %s's devices changed from %s to %s", i, uid, p.visible, got)
		}
		for _, c := range ct.claims {
			if string(c.UID) != uid {
				continue
			}
			for _, r := range c.Status.Allocation.Devices.Results {
				if n, err := devicemodel.ParseName(r.Device); err == nil && n.Type == devicemodel.TypeMIG {
					wantMIG[n.Start] = true
				}
				if strings.Contains(r.Device, "-ts-") {
					wantInterval = "Long"
				}
			}
		}
	}
	sort.Strings(want)
	var specs []string
	for _, name := range dirEntries(ct.opts.CDIRoot) {
		if uid, ok := cdispec.ClaimUIDFromSpecName(name); ok {
			specs = append(specs, uid)
		} else {
			t.Errorf("after crash %d: unexpected file %s in the CDI directory", i, name)
		}
	}
	sort.Strings(specs)
	all, _ := os.ReadDir(ct.opts.CDIRoot)
	for _, e := range all {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("after crash %d: temporary file %s left in the CDI directory", i, e.Name())
		}
	}
	if !slices.Equal(specs, want) {
		t.Errorf("after crash %d: specs %v, prepared %v", i, specs, want)
	}
	var records []string
	for _, name := range dirEntries(filepath.Join(ct.opts.PluginDataDir, checkpointDir)) {
		records = append(records, strings.TrimSuffix(name, ".json"))
	}
	sort.Strings(records)
	if !slices.Equal(records, want) {
		t.Errorf("after crash %d: checkpoints %v, prepared %v", i, records, want)
	}
	for _, a := range dirEntries(filepath.Join(ct.opts.PluginDataDir, accountingDir)) {
		if !slices.Contains(want, a) {
			t.Errorf("after crash %d: accounting directory of unprepared claim %s left", i, a)
		}
	}
	gotMIG := ct.mockMIGStarts()
	if len(gotMIG) != len(wantMIG) {
		t.Errorf("after crash %d: MIG instances at placements %v, prepared claims hold %v", i, gotMIG, wantMIG)
	}
	for _, s := range gotMIG {
		if !wantMIG[s] {
			t.Errorf("after crash %d: leaked MIG instance at placement %d", i, s)
		}
	}
	st, err := timeslice.ReadRecorded(filepath.Join(ct.opts.PluginDataDir, MockTimeSliceFile))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(st[ct.tsGPU]); got != wantInterval && (got != "" || wantInterval != v1Default) {
		t.Errorf("after crash %d: GPU 2's time slice is %q, want %q", i, got, wantInterval)
	}
}

const v1Default = "Default"

func (ct *crashTest) visibleByUID(uid string) string {
	for _, c := range ct.claims {
		if string(c.UID) == uid {
			return ct.visible(c)
		}
	}
	return ""
}

// mockMIGStarts lists the placements of the GPU instances in the mock's
// persisted state.
func (ct *crashTest) mockMIGStarts() []int {
	data, err := os.ReadFile(filepath.Join(ct.opts.PluginDataDir, "mock-gpu-state.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		ct.t.Fatal(err)
	}
	var st struct {
		GPUs map[string]struct {
			GIs []struct {
				Start int `json:"start"`
			} `json:"gpuInstances"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		ct.t.Fatalf("mock state: %v", err)
	}
	var out []int
	for _, g := range st.GPUs {
		for _, gi := range g.GIs {
			out = append(out, gi.Start)
		}
	}
	sort.Ints(out)
	return out
}
