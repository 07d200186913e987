package localcluster

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func testCluster(t *testing.T) *Cluster {
	t.Helper()
	c, err := New(Options{WorkDir: t.TempDir(), Logf: func(string, ...any) {}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPluginConfig(t *testing.T) {
	a := PluginConfig{Profile: "t4:2", Args: []string{"--time-slices=4"}}
	if !a.Equal(PluginConfig{Profile: "t4:2", Args: []string{"--time-slices=4"}}) || a.Equal(PluginConfig{Profile: "t4:2"}) {
		t.Error("Equal")
	}
	if a.String() != "--mock-profile=t4:2 --time-slices=4" {
		t.Errorf("String() = %q", a.String())
	}
	c := testCluster(t)
	c.Opts.PluginArgs = []string{"--rescan-interval=5s"}
	args := c.pluginArgs(a)
	if !slices.Contains(args, "--mock-profile=t4:2") || args[len(args)-1] != "--time-slices=4" || args[len(args)-2] != "--rescan-interval=5s" {
		t.Errorf("pluginArgs = %v: the configuration's flags come last, after Options.PluginArgs", args)
	}
}

func slice(name string, gen, count int64, devices ...string) *resourceapi.ResourceSlice {
	node := NodeName
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   DriverName,
			NodeName: &node,
			Pool:     resourceapi.ResourcePool{Name: NodeName, Generation: gen, ResourceSliceCount: count},
		},
	}
	for _, d := range devices {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: d})
	}
	return s
}

// PublishedDevices reads only the newest complete generation, so a slice
// left by an earlier plugin configuration never passes for the new one.
func TestPublishedDevices(t *testing.T) {
	c := testCluster(t)
	ctx := context.Background()
	client := fake.NewSimpleClientset()
	c.Client = client
	if got, _ := c.PublishedDevices(ctx); got != nil {
		t.Errorf("nothing published: got %v", got)
	}
	create := func(s *resourceapi.ResourceSlice) {
		if _, err := client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create(slice("old", 1, 1, "gpu-1", "gpu-0"))
	if got, _ := c.PublishedDevices(ctx); !slices.Equal(got, []string{"gpu-0", "gpu-1"}) {
		t.Errorf("generation 1: got %v", got)
	}
	create(slice("new-a", 2, 2, "gpu-0", "gpu-0-ts-0"))
	if got, _ := c.PublishedDevices(ctx); got != nil {
		t.Errorf("generation 2 is incomplete (1 of 2 slices): got %v", got)
	}
	create(slice("new-b", 2, 2, "gpu-1", "gpu-1-ts-0"))
	if got, _ := c.PublishedDevices(ctx); !slices.Equal(got, []string{"gpu-0", "gpu-0-ts-0", "gpu-1", "gpu-1-ts-0"}) {
		t.Errorf("generation 2: got %v", got)
	}
}

// The expected device set is read from the plugin's own --print-slices.
func TestExpectedDevicesFromPrintSlices(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kubelet plugin")
	}
	c := testCluster(t)
	if c.Opts.RepoRoot == "" {
		t.Skip("not in the repository")
	}
	if err := c.goBuild(context.Background(), c.PluginBinary(), "./cmd/kubelet-plugin"); err != nil {
		t.Fatal(err)
	}
	got, err := c.expectedDevices(context.Background(), c.pluginArgs(PluginConfig{Profile: "t4:2", Args: []string{"--time-slices=2"}}))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"gpu-0", "gpu-0-ts-0", "gpu-0-ts-1", "gpu-1", "gpu-1-ts-0", "gpu-1-ts-1"}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// A live owner other than this process makes Down refuse and Up wait; a
// dead one (or a reused PID) frees the cluster.
func TestOwnership(t *testing.T) {
	c := testCluster(t)
	if o := c.CurrentOwner(); o != nil {
		t.Fatalf("fresh work dir has owner %v", o)
	}
	if err := c.claimOwnership(context.Background()); err != nil {
		t.Fatal(err)
	}
	if o := c.CurrentOwner(); o != nil {
		t.Fatalf("this process owns it, CurrentOwner must be nil, got %v", o)
	}

	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
	pid := other.Process.Pid
	write := func(start string) {
		t.Helper()
		if err := os.WriteFile(c.ownerFile(), []byte(strings.Join([]string{strconv.Itoa(pid), start, "sleep 60"}, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(procStart(pid))
	o := c.CurrentOwner()
	if o == nil || o.PID != pid {
		t.Fatalf("live owner not seen: %v", o)
	}
	// (Down's first step; Down itself is not called here: it would tear
	// down the machine's real cluster state.)
	if err := c.checkNotInUse(); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("Down while another live process owns the cluster: %v", err)
	}
	ownerWait = 300 * time.Millisecond
	defer func() { ownerWait = 30 * time.Minute }()
	if err := c.claimOwnership(context.Background()); err == nil {
		t.Error("claimOwnership succeeded while another live process owns the cluster")
	}

	write("1") // the PID now belongs to another process than recorded
	if o := c.CurrentOwner(); o != nil {
		t.Errorf("reused PID counted as owner: %v", o)
	}
	write(procStart(pid))
	_ = other.Process.Kill()
	_ = other.Wait()
	if o := c.CurrentOwner(); o != nil {
		t.Errorf("dead owner counted: %v", o)
	}
	if err := c.claimOwnership(context.Background()); err != nil {
		t.Errorf("claimOwnership after the owner died: %v", err)
	}
}
