//go:build e2e

package e2e

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-dev/tessera/test/scenario"
)

// The demo scenarios (demo/<name>, run by `make demo`), asserted through the
// API (the claims' allocation) and the containers' logs (their environment).

// TestDemoShowdown: inference 2000Mi x 2, training 8000Mi, preprocessing
// 3000Mi all share the node's one T4 (gpu-0); each container's limits equal
// its share.
func TestDemoShowdown(t *testing.T) {
	r, pls := runScenario(t, "showdown")
	want := map[string]int64{"inference-1": 2000, "inference-2": 2000, "training": 8000, "preprocessing": 3000}
	if len(pls) != len(want) {
		t.Fatalf("want %d pods, got %d", len(want), len(pls))
	}
	var files []string
	shares := map[string]string{}
	gpu := ""
	var total int64
	for name, mem := range want {
		pl, ok := pls[name]
		if !ok {
			t.Fatalf("no pod %s", name)
		}
		if pl.Pod.Status.Phase != corev1.PodRunning {
			t.Errorf("%s is %s, want Running", name, pl.Pod.Status.Phase)
		}
		c, d := oneDevice(t, pl)
		if d.Name != "gpu-0" || d.Type() != "gpu" {
			t.Errorf("%s landed on %s (type %s), want gpu-0: all four share the one T4", name, d.Name, d.Type())
		}
		if gpu == "" {
			gpu = d.GPU()
		} else if d.GPU() != gpu {
			t.Errorf("%s is on GPU %s, the others on %s", name, d.GPU(), gpu)
		}
		if d.Memory == nil || d.Memory.Value() != mib(mem) {
			t.Errorf("%s: consumedCapacity memory %s, want %dMi", name, scenario.FormatMemory(d.Memory), mem)
		}
		if d.ShareID == "" {
			t.Errorf("%s: allocation has no shareID", name)
		} else if other, dup := shares[d.ShareID]; dup {
			t.Errorf("%s and %s have the same shareID %s", name, other, d.ShareID)
		}
		shares[d.ShareID] = name
		if d.Memory != nil {
			total += d.Memory.Value()
		}
		if !strings.HasPrefix(d.Attributes["productName"], "Tesla T4") {
			t.Errorf("%s: productName %q, want a Tesla T4", name, d.Attributes["productName"])
		}
		checkEnv(t, r.Namespace, pl, envWant{mode: "interposer", enforced: "advisory", uuid: d.Attributes["uuid"]})
		// No cores requested: the class's compute default (uncapped, the
		// work-conserving default) leaves the share every SM.
		if got := pl.Env["TESSERA_COMPUTE_LIMIT"]; got != "100" {
			t.Errorf("%s: TESSERA_COMPUTE_LIMIT=%q, want 100 (no cores requested, compute default uncapped)", name, got)
		}
		if got := pl.Env["CUDA_DEVICE_SM_LIMIT_0"]; got != "100" {
			t.Errorf("%s: CUDA_DEVICE_SM_LIMIT_0=%q, want 100 (uncapped)", name, got)
		}
		files = append(files, hostFilesOfClaim(t, c.UID)...)
	}
	if total != mib(15000) {
		t.Errorf("gpu-0 carries %d bytes of shares, want 15000Mi", total)
	}
	// The showdown ends with allocated vs used per claim: the table of
	// `kubectl tessera top`, once the plugin sampled every claim.
	var out strings.Builder
	r.Out = &out
	s, _ := scenario.Find("showdown")
	if err := s.After(t.Context(), r); err != nil {
		t.Fatalf("allocated vs used: %v", err)
	}
	t.Logf("%s", out.String())
	used := map[string]string{"inference-1": "600Mi", "inference-2": "700Mi", "training": "5000Mi", "preprocessing": "800Mi"}
	for name, u := range used {
		var row string
		for _, l := range strings.Split(out.String(), "\n") {
			if f := strings.Fields(l); len(f) > 2 && f[2] == name {
				row = l
			}
		}
		alloc := scenario.FormatMemory(resource.NewQuantity(mib(want[name]), resource.BinarySI))
		if !strings.Contains(row, alloc) || !strings.Contains(row, u) {
			t.Errorf("%s: row %q, want %s allocated and %s used", name, row, alloc, u)
		}
	}
	cleanupAndCheck(t, r, files)
}

// TestDemoWholeGPU: a whole GPU is exclusive; a share lands on the other
// GPU; a share that must use GPU 0 stays Pending with the scheduler's reason
// and starts there once the whole GPU is freed.
func TestDemoWholeGPU(t *testing.T) {
	r, pls := runScenario(t, "whole-gpu")
	var files []string

	ex := pls["exclusive"]
	c, d := oneDevice(t, ex)
	if d.Name != "gpu-0" {
		t.Errorf("exclusive landed on %s, want gpu-0", d.Name)
	}
	if d.Capacity == nil || d.Memory == nil || d.Memory.Cmp(*d.Capacity) != 0 {
		t.Errorf("exclusive consumed %s of %s: a claim without capacity must take all of it", scenario.FormatMemory(d.Memory), scenario.FormatMemory(d.Capacity))
	}
	checkEnv(t, r.Namespace, ex, envWant{mode: "exclusive", enforced: "hard", uuid: d.Attributes["uuid"]})
	exclusiveFiles := hostFilesOfClaim(t, c.UID)
	gpu0 := d.Attributes["uuid"]

	sh := pls["share"]
	c, d = oneDevice(t, sh)
	if d.Name != "gpu-1" {
		t.Errorf("share landed on %s, want gpu-1 (gpu-0 is taken whole)", d.Name)
	}
	if d.Memory == nil || d.Memory.Value() != 4<<30 {
		t.Errorf("share consumed %s, want 4Gi", scenario.FormatMemory(d.Memory))
	}
	checkEnv(t, r.Namespace, sh, envWant{mode: "none", enforced: "advisory", uuid: d.Attributes["uuid"]})
	files = append(files, hostFilesOfClaim(t, c.UID)...)

	pending := pls["share-on-gpu0"]
	if pending.Pod.Status.Phase != corev1.PodPending || pending.Pod.Spec.NodeName != "" {
		t.Fatalf("share-on-gpu0 is %s on %q, want Pending and unscheduled", pending.Pod.Status.Phase, pending.Pod.Spec.NodeName)
	}
	var cond *corev1.PodCondition
	for i := range pending.Pod.Status.Conditions {
		if pending.Pod.Status.Conditions[i].Type == corev1.PodScheduled {
			cond = &pending.Pod.Status.Conditions[i]
		}
	}
	if cond == nil || cond.Status != corev1.ConditionFalse || cond.Reason != corev1.PodReasonUnschedulable {
		t.Fatalf("share-on-gpu0: PodScheduled condition %+v, want False/Unschedulable", cond)
	}
	if !strings.Contains(cond.Message, "claim") {
		t.Errorf("share-on-gpu0: the scheduler's message %q does not say the claim cannot be allocated", cond.Message)
	}
	t.Logf("scheduler: %s", cond.Message)

	// Free gpu-0: the pending share starts there.
	s, _ := scenario.Find("whole-gpu")
	if err := s.After(t.Context(), r); err != nil {
		t.Fatalf("freeing gpu-0: %v", err)
	}
	checkGone(t, "after the exclusive pod was deleted", exclusiveFiles)
	pls = readPlacements(t, r, false) // After has shown them

	started := pls["share-on-gpu0"]
	if started.Pod.Status.Phase != corev1.PodRunning {
		t.Fatalf("share-on-gpu0 is %s after gpu-0 was freed", started.Pod.Status.Phase)
	}
	c, d = oneDevice(t, started)
	if d.Name != "gpu-0" || d.Attributes["uuid"] != gpu0 {
		t.Errorf("share-on-gpu0 landed on %s, want gpu-0", d.Name)
	}
	checkEnv(t, r.Namespace, started, envWant{mode: "none", enforced: "advisory", uuid: gpu0})
	files = append(files, hostFilesOfClaim(t, c.UID)...)
	cleanupAndCheck(t, r, files)
}

// TestDemoTimeSlice: with --time-slices=4 four pods get the four partitions
// of gpu-0, each sees the same GPU, its own partition and its memory.
func TestDemoTimeSlice(t *testing.T) {
	r, pls := runScenario(t, "timeslice")
	if len(pls) != 4 {
		t.Fatalf("want 4 pods, got %d", len(pls))
	}
	var files []string
	partitions := map[string]string{}
	gpu := ""
	for name, pl := range pls {
		c, d := oneDevice(t, pl)
		if d.Type() != "timeslice" || !strings.HasPrefix(d.Name, "gpu-0-ts-") {
			t.Errorf("%s got %s (type %s), want a time-slice partition of gpu-0", name, d.Name, d.Type())
		}
		if other, dup := partitions[d.Name]; dup {
			t.Errorf("%s and %s got the same partition %s", name, other, d.Name)
		}
		partitions[d.Name] = name
		if gpu == "" {
			gpu = d.GPU()
		} else if gpu != d.GPU() {
			t.Errorf("%s is on GPU %s, the others on %s", name, d.GPU(), gpu)
		}
		if d.Memory == nil || d.Memory.Value() != mib(15104/4) {
			t.Errorf("%s: partition memory %s, want %dMi", name, scenario.FormatMemory(d.Memory), 15104/4)
		}
		if d.Attributes["timeSlices"] != "4" {
			t.Errorf("%s: timeSlices attribute %q, want 4", name, d.Attributes["timeSlices"])
		}
		checkEnv(t, r.Namespace, pl, envWant{mode: "interposer", enforced: "advisory", uuid: d.Attributes["uuid"]})
		files = append(files, hostFilesOfClaim(t, c.UID)...)
	}
	cleanupAndCheck(t, r, files)
}

// TestDemoMIG: on a mock H100 in MIG mode, 1g.10gb x 2 and 3g.40gb are
// created at prepare; each container sees its own MIG device UUID.
func TestDemoMIG(t *testing.T) {
	r, pls := runScenario(t, "mig")
	want := map[string]string{"small-1": "1g.10gb", "small-2": "1g.10gb", "large": "3g.40gb"}
	if len(pls) != len(want) {
		t.Fatalf("want %d pods, got %d", len(want), len(pls))
	}
	var files []string
	uuids := map[string]string{}
	for name, profile := range want {
		pl := pls[name]
		c, d := oneDevice(t, pl)
		if d.Type() != "mig" || d.Attributes["migProfile"] != profile {
			t.Errorf("%s got %s (type %s, profile %s), want a %s MIG device", name, d.Name, d.Type(), d.Attributes["migProfile"], profile)
		}
		if !strings.HasPrefix(d.Attributes["productName"], "NVIDIA H100") {
			t.Errorf("%s: productName %q, want an H100", name, d.Attributes["productName"])
		}
		mig := pl.Env["NVIDIA_VISIBLE_DEVICES"]
		if !strings.HasPrefix(mig, "MIG-") {
			t.Errorf("%s: NVIDIA_VISIBLE_DEVICES=%q, want a MIG device UUID", name, mig)
		}
		if other, dup := uuids[mig]; dup {
			t.Errorf("%s and %s see the same MIG device %s", name, other, mig)
		}
		uuids[mig] = name
		if mig == d.GPU() {
			t.Errorf("%s sees the parent GPU's UUID, not its MIG device", name)
		}
		// checkEnv also checks the claim's status.devices data names this MIG UUID.
		checkEnv(t, r.Namespace, pl, envWant{mode: "mig", enforced: "hard", uuid: mig})
		files = append(files, hostFilesOfClaim(t, c.UID)...)
	}
	cleanupAndCheck(t, r, files)
}
