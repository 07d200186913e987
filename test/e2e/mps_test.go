//go:build e2e

package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/hack/demo/scenario"
	"github.com/tessera-dev/tessera/test/localcluster"
)

// TestMPSPerClaim: with --mps-control (the mock backend's fake daemon) two
// claims in mps mode each get their own MPS daemon with the limits set on
// the daemon side; each container sees only its own claim's pipe
// directory; deleting the pods stops the daemons and removes their
// directories.
func TestMPSPerClaim(t *testing.T) {
	usePlugin(t, localcluster.PluginConfig{Profile: localcluster.DefaultProfile, Args: []string{"--mps-control=fake"}})
	ns := newNamespace(t)
	cfg := `{"apiVersion":"tessera.dev/v1alpha1","kind":"GpuConfig","enforcement":"mps"}`
	pods := map[string]string{"mps-a": "1Gi", "mps-b": "2Gi"}
	for name, mem := range pods {
		createTemplate(t, ns, shareTemplate(name, mem, cfg))
		p := claimPod(name, name)
		// Print the variables, then what the container sees of MPS,
		// prefixed so that it is not read as variables.
		p.Spec.Containers[0].Command = []string{"sh", "-c",
			"env | grep -E 'TESSERA|CUDA|NVIDIA' | sort; ls /tmp/nvidia-mps | sed 's/^/MPS-LS: /'; " +
				"sed 's/^/MPS-CONTROL: /' /tmp/nvidia-mps/control; sed 's/^/MPS-CMD: /' /tmp/nvidia-mps/commands; exec sleep 3600"}
		createPod(t, ns, p)
	}
	r := scenario.NewRun(scenarioEnv(t), scenario.Scenario{Name: "mps"}, ns)
	if err := r.WaitPods(t.Context(), []string{"mps-a", "mps-b"}); err != nil {
		t.Fatal(err)
	}
	pls := placements(t, r)
	var files []string
	for name, mem := range pods {
		pl := pls[name]
		c, d := oneDevice(t, pl)
		pipe := filepath.Join(scenario.PluginDataDir, "mps", string(c.UID), "pipe")
		if pl.Env["TESSERA_MODE"] != "mps" || pl.Env["TESSERA_ENFORCED"] != "mps" || pl.Env["CUDA_MPS_PIPE_DIRECTORY"] != "/tmp/nvidia-mps" {
			t.Errorf("%s: mode %q enforced %q pipe %q", name, pl.Env["TESSERA_MODE"], pl.Env["TESSERA_ENFORCED"], pl.Env["CUDA_MPS_PIPE_DIRECTORY"])
		}
		// The daemon the container reaches is its own claim's.
		if want := "MPS-CONTROL: CUDA_MPS_PIPE_DIRECTORY=" + pipe; !strings.Contains(pl.Log, want) {
			t.Errorf("%s: the container's MPS pipe is not its claim's daemon (want %q); log:\n%s", name, want, pl.Log)
		}
		for other := range pods {
			if other == name {
				continue
			}
			oc, _ := oneDevice(t, pls[other])
			if strings.Contains(pl.Log, string(oc.UID)) {
				t.Errorf("%s: the container sees claim %s's MPS daemon; log:\n%s", name, other, pl.Log)
			}
		}
		// Daemon-side limits: the allocated memory on the claim's GPU.
		mib := map[string]int{"1Gi": 1024, "2Gi": 2048}[mem]
		if d.Memory == nil || d.Memory.Value()>>20 != int64(mib) {
			t.Errorf("%s: allocated memory %v, want %dMi", name, d.Memory, mib)
		}
		want := fmt.Sprintf("MPS-CMD: set_default_device_pinned_mem_limit %s %dM", d.Attributes["uuid"], mib)
		if !strings.Contains(pl.Log, want) {
			t.Errorf("%s: daemon commands lack %q; log:\n%s", name, want, pl.Log)
		}
		// Only one MPS mount, from the claim's own pipe directory.
		_, spec := claimSpecFile(t, c.UID)
		var mounts []string
		for _, m := range spec.ContainerEdits.Mounts {
			if m.ContainerPath == "/tmp/nvidia-mps" {
				mounts = append(mounts, m.HostPath)
			}
		}
		if len(mounts) != 1 || mounts[0] != pipe {
			t.Errorf("%s: MPS mounts %v, want only %s", name, mounts, pipe)
		}
		files = append(files, hostFilesOfClaim(t, c.UID)...)
		files = append(files, filepath.Join(pipe, "control"))
	}
	// Unprepare quits each daemon (the fake removes its control file) and
	// removes its directories.
	cleanupAndCheck(t, r, files)
}
