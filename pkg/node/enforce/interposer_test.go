package enforce

import (
	"slices"
	"strings"
	"testing"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

// TestPreloadFile: in interposer mode with a library the claim's preload
// file is mounted read-only over /etc/ld.so.preload, naming the library's
// container path, and LD_PRELOAD stays; nothing else mounts it.
func TestPreloadFile(t *testing.T) {
	lib := "/opt/hami/libvgpu.so"
	hostFile := "/var/lib/tessera/claims/uid-1/ld.so.preload"
	inter := cfg(v1alpha1.EnforcementInterposer)
	tests := []struct {
		name        string
		allocs      []Allocation
		node        Node
		preloadFile string
		wantFile    bool
		wantEnv     bool
	}{
		{"interposer with library", []Allocation{share("gpu-0", gpu0, 4*gib, 30, inter)}, Node{InterposerLibrary: lib}, hostFile, true, true},
		{"auto resolving to the interposer", []Allocation{share("gpu-0", gpu0, 4*gib, 0, cfg(""))}, Node{InterposerLibrary: lib}, hostFile, true, true},
		{"caller gives no file: LD_PRELOAD only", []Allocation{share("gpu-0", gpu0, 4*gib, 30, inter)}, Node{InterposerLibrary: lib}, "", false, true},
		{"interposer without library", []Allocation{share("gpu-0", gpu0, 4*gib, 30, inter)}, Node{}, hostFile, false, false},
		{"mps", []Allocation{share("gpu-0", gpu0, 4*gib, 30, cfg(v1alpha1.EnforcementMPS))}, Node{InterposerLibrary: lib, MPSPerClaim: true}, hostFile, false, false},
		{"none", []Allocation{share("gpu-0", gpu0, 4*gib, 30, cfg(v1alpha1.EnforcementNone))}, Node{InterposerLibrary: lib}, hostFile, false, false},
		{"whole GPU", []Allocation{{Request: "gpu", Device: "gpu-0", Type: devicemodel.TypeGPU, UUID: gpu0, GPUUUID: gpu0, Memory: 16 * gib, Whole: true, ReportedTotal: 16 * gib, Config: inter}}, Node{InterposerLibrary: lib}, hostFile, false, false},
		{"MIG device next to a share", []Allocation{
			{Request: "mig", Device: "gpu-1-mig-1g10gb-0", Type: devicemodel.TypeMIG, UUID: migUUID, GPUUUID: gpu1, Memory: 10 * gib, ReportedTotal: 10 * gib, Config: inter},
			share("gpu-0", gpu0, 4*gib, 0, inter),
		}, Node{InterposerLibrary: lib}, hostFile, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			claim := Claim{Namespace: "ns", Name: "c", UID: "uid-1", ShareKey: "abc", PreloadFile: tt.preloadFile, MPSPipeDir: "/var/lib/tessera/mps/uid-1"}
			res, err := Plan(claim, tt.allocs, tt.node, "/var/lib/tessera/accounting/uid-1")
			if err != nil {
				t.Fatal(err)
			}
			var preload []string
			for _, m := range res.Mounts {
				if m.ContainerPath != LDSoPreload {
					continue
				}
				preload = append(preload, m.HostPath)
				if !slices.Contains(m.Options, "ro") || !slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rw") {
					t.Errorf("preload mount options %v: want a read-only bind mount", m.Options)
				}
			}
			if tt.wantFile {
				if !slices.Equal(preload, []string{hostFile}) || res.PreloadFile != hostFile {
					t.Fatalf("preload mounts %v, file %q; want %s once", preload, res.PreloadFile, hostFile)
				}
				if got := string(res.PreloadContent); got != "/usr/local/tessera/lib/libvgpu.so\n" {
					t.Errorf("preload content %q", got)
				}
			} else if len(preload) > 0 || res.PreloadFile != "" || res.PreloadContent != nil {
				t.Fatalf("preload file mounted or asked for: %v %q %q", preload, res.PreloadFile, res.PreloadContent)
			}
			if got := slices.Contains(res.Env, "LD_PRELOAD=/usr/local/tessera/lib/libvgpu.so"); got != tt.wantEnv {
				t.Errorf("LD_PRELOAD set: %v, want %v (%v)", got, tt.wantEnv, res.Env)
			}
		})
	}
}

// TestHAMiCoreInputs: in interposer mode with the node's library, the CDI
// spec sets every variable HAMi-core (HAMiCoreVersion) reads but its log
// level, to Tessera's value or HAMi-core's own default, so that neither
// the pod's env nor the image's ENV reaches it (CDI edits come last);
// CUDA_REDIRECT names the interposer itself, so the dlsym hook never hands
// out another library's cu* symbols (an image's /usr/local/vgpu/libvgpu.so);
// and HAMi-core's override file is masked with /dev/null, read-only. In
// the other modes nothing of this is set.
func TestHAMiCoreInputs(t *testing.T) {
	lib := "/opt/hami/libvgpu.so"
	inter := cfg(v1alpha1.EnforcementInterposer)
	for _, tt := range []struct {
		name   string
		allocs []Allocation
		node   Node
		want   bool
	}{
		{"interposer with library", []Allocation{share("gpu-0", gpu0, 4*gib, 30, inter)}, Node{InterposerLibrary: lib}, true},
		{"mps", []Allocation{share("gpu-0", gpu0, 4*gib, 30, cfg(v1alpha1.EnforcementMPS))}, Node{InterposerLibrary: lib, MPSPerClaim: true}, false},
		{"none", []Allocation{share("gpu-0", gpu0, 4*gib, 30, cfg(v1alpha1.EnforcementNone))}, Node{InterposerLibrary: lib}, false},
		{"whole GPU", []Allocation{{Request: "gpu", Device: "gpu-0", Type: devicemodel.TypeGPU, UUID: gpu0, GPUUUID: gpu0, Memory: 16 * gib, Whole: true, ReportedTotal: 16 * gib, Config: inter}}, Node{InterposerLibrary: lib}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			claim := Claim{Namespace: "ns", Name: "c", UID: "uid-1", ShareKey: "abc", PreloadFile: "/p", MPSPipeDir: "/m"}
			res, err := Plan(claim, tt.allocs, tt.node, "/var/lib/tessera/accounting/uid-1")
			if err != nil {
				t.Fatal(err)
			}
			env := map[string]string{}
			for _, e := range res.Env {
				k, v, _ := strings.Cut(e, "=")
				env[k] = v
			}
			for _, name := range HAMiCoreEnv {
				name = strings.ReplaceAll(name, "<i>", "0")
				_, set := env[name]
				switch {
				case name == "LIBCUDA_LOG_LEVEL" && set:
					t.Errorf("%s set: it is the pod's to choose", name)
				case name == "LIBCUDA_LOG_LEVEL", name == EnvCudaVisibleDevices:
				case tt.want && !set:
					t.Errorf("%s is not set: the pod or the image could set it (%v)", name, res.Env)
				case !tt.want && set && name != EnvCudaVisibleDevices:
					t.Errorf("%s set outside interposer mode", name)
				}
			}
			if tt.want && env[EnvCUDARedirect] != env[EnvLDPreload] {
				t.Errorf("CUDA_REDIRECT=%q, want the interposer itself (%s)", env[EnvCUDARedirect], env[EnvLDPreload])
			}
			var masked []*cdispec.Mount
			for _, m := range res.Mounts {
				if m.ContainerPath == OverrideEnvFile {
					masked = append(masked, m)
				}
			}
			switch {
			case tt.want && (len(masked) != 1 || masked[0].HostPath != "/dev/null" || !slices.Contains(masked[0].Options, "ro")):
				t.Errorf("%s not masked read-only with /dev/null: %+v", OverrideEnvFile, masked)
			case !tt.want && len(masked) > 0:
				t.Errorf("%s masked outside interposer mode", OverrideEnvFile)
			}
		})
	}
}

func TestPreloadListFromSpec(t *testing.T) {
	spec := func(env ...string) *cdispec.Spec {
		return &cdispec.Spec{ContainerEdits: cdispec.ContainerEdits{Env: env}}
	}
	for _, tt := range []struct {
		name string
		spec *cdispec.Spec
		want string
		ok   bool
	}{
		{"nil spec", nil, "", false},
		{"no LD_PRELOAD", spec("A=1"), "", false},
		{"empty LD_PRELOAD", spec("LD_PRELOAD="), "", false},
		{"one library", spec("A=1", "LD_PRELOAD=/usr/local/tessera/lib/libvgpu.so"), "/usr/local/tessera/lib/libvgpu.so\n", true},
		{"several", spec("LD_PRELOAD=/a.so:/b.so"), "/a.so\n/b.so\n", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := PreloadListFromSpec(tt.spec)
			if ok != tt.ok || string(got) != tt.want {
				t.Errorf("got %q %v, want %q %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}
