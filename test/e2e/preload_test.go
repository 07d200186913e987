//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/pkg/node/enforce"
	"github.com/tessera-dev/tessera/test/localcluster"
)

// fixtureInterposer is a stand-in interposer library: its constructor says
// that it was loaded and what LD_PRELOAD the process has.
const fixtureInterposer = `#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void loaded(void) {
	const char *p = getenv("LD_PRELOAD");
	fprintf(stderr, "FIXTURE-INTERPOSER loaded, LD_PRELOAD=%s\n", p ? p : "(unset)");
}
`

// TestPreloadWithoutLDPreload: in interposer mode the claim's containers get
// the library through a read-only /etc/ld.so.preload, so a process that
// unsets LD_PRELOAD (busybox `env -u LD_PRELOAD`, then a dynamically
// linked program, the host's cat) still loads it: the fixture library's
// constructor runs and /proc/self/maps lists it. The control, the same
// pod without the claim, does not load it. The busybox image has no
// loader: the pod mounts the host's glibc loader and libraries and cat
// (hostPath, read-only).
func TestPreloadWithoutLDPreload(t *testing.T) {
	usePlugin(t, interposerPlugin(t))

	// The host's cat and every file its loader needs.
	const cat = "/usr/bin/cat"
	out, err := exec.Command("ldd", cat).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v (the probe needs a dynamically linked cat)", cat, err)
	}
	files := []string{cat}
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") {
				files = append(files, f)
			}
		}
	}
	probe := func(name string, claim bool) *corev1.Pod {
		script := "env -u LD_PRELOAD /probe/cat /proc/self/maps 2>&1 | sed 's/^/PROBE: /'; exec sleep 3600"
		p := busyboxPod(name, "sh", "-c", script)
		if claim {
			p = claimPod(name, "share")
			p.Spec.Containers[0].Command = []string{"sh", "-c", "echo \"LD_PRELOAD=$LD_PRELOAD\"; " + script}
		}
		for i, f := range files {
			vol := "host-" + string(rune('a'+i))
			to := f
			if f == cat {
				to = "/probe/cat"
			}
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: vol, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: f}}})
			p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: vol, MountPath: to, ReadOnly: true})
		}
		return p
	}
	// The probe mounts host files: a namespace an administrator exempted
	// from Tessera's sandbox (the test's admin is one).
	ns := exemptNamespace(t)
	createTemplate(t, ns, shareTemplate("share", "1Gi", `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","enforcement":"interposer"}`))
	createPod(t, ns, probe("claim", true))
	createPod(t, ns, probe("control", false))
	logs := map[string]string{}
	for _, name := range []string{"claim", "control"} {
		waitPodPhase(t, ns, name, corev1.PodRunning, 2*time.Minute)
		waitFor(t, time.Minute, name+"'s probe output", func(context.Context) (bool, error) {
			logs[name] = podLogs(t, ns, name)
			return strings.Contains(logs[name], "PROBE: "), nil
		})
		t.Logf("%s:\n%s", name, logs[name])
	}
	inContainer := filepath.Join(enforce.InterposerDir, "libvgpu.so")
	if !strings.Contains(logs["claim"], "LD_PRELOAD="+inContainer) {
		t.Errorf("the claim's container has no LD_PRELOAD=%s; is the plugin in interposer mode with the fixture?", inContainer)
	}
	for _, want := range []string{"PROBE: FIXTURE-INTERPOSER loaded, LD_PRELOAD=(unset)", inContainer} {
		if !strings.Contains(logs["claim"], want) {
			t.Errorf("with LD_PRELOAD unset, the claim's process lacks %q: the preload file did not load the interposer", want)
		}
	}
	if strings.Contains(logs["control"], "FIXTURE-INTERPOSER") || strings.Contains(logs["control"], "libvgpu") {
		t.Error("the control pod, without the claim, loaded the interposer: the probe proves nothing")
	}
	if !strings.Contains(logs["control"], "PROBE: ") || !strings.Contains(logs["control"], "/probe/cat") {
		t.Error("the control's cat did not run (no maps): the probe proves nothing")
	}
}

// interposerPlugin builds the fixture interposer (once per cluster
// directory) and returns the plugin configuration that preloads it
// (--interposer-library).
func interposerPlugin(t *testing.T) localcluster.PluginConfig {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Fatal("needs a C compiler for the fixture interposer (the plugin's cgo build needs one too)")
	}
	dir := filepath.Join(cluster.Dirs.Root, "interposer-fixture")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, lib := filepath.Join(dir, "fixture.c"), filepath.Join(dir, "libvgpu.so")
	if err := os.WriteFile(src, []byte(fixtureInterposer), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("building the fixture interposer: %v\n%s", err, out)
	}
	return localcluster.PluginConfig{Profile: localcluster.DefaultProfile, Args: []string{"--interposer-library=" + lib}}
}
