package prepare

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/pkg/node/enforce"
)

// preloadProbe is a stand-in interposer: it says, from its constructor,
// into which program it was loaded and with which LD_PRELOAD.
const preloadProbe = `#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void tessera_probe(void) {
	const char *p = getenv("LD_PRELOAD");
	dprintf(2, "interposer-loaded comm=%s ld_preload=%s\n", program_invocation_short_name, p ? p : "<unset>");
}
`

// TestPreloadFileLoadsWithoutLDPreload runs glibc's real loader on a
// container root that has what a claim's CDI spec mounts (the library and
// the claim's ld.so.preload, bind-mounted read-only in a private mount
// namespace): a program started with LD_PRELOAD unset, or with an empty
// environment, still loads the interposer; without the preload file (the
// LD_PRELOAD-only delivery of before) it does not. Needs root and a C
// compiler; the e2e cluster's images are static busybox, without a loader.
func TestPreloadFileLoadsWithoutLDPreload(t *testing.T) {
	// make test runs as root (README); only a developer's `go test` as
	// another user skips, never CI (CI=true).
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("CI runs make test as root; this test needs root (bind mounts, chroot)")
		}
		t.Skip("needs root: bind mounts in a private mount namespace and chroot")
	}
	// The rest is a failure, not a skip: cc builds the plugin itself (cgo),
	// and unshare, chroot and ldd come with every glibc system.
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Fatal("needs a C compiler for the stand-in interposer (the plugin's cgo build needs one too)")
	}
	for _, tool := range []string{"unshare", "chroot", "ldd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("needs %s", tool)
		}
	}
	work := t.TempDir()
	src := filepath.Join(work, "probe.c")
	lib := filepath.Join(work, "libvgpu.so")
	if err := os.WriteFile(src, []byte(preloadProbe), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("building the stand-in interposer: %v\n%s", err, out)
	}

	e := newEnv(t, withInterposer(lib))
	c := claim("a", share("gpu", "gpu-0", "s-1", 4*gib, 25))
	spec := e.injectSpec(e.prepare(c)...)
	var ldPreload string
	for _, kv := range spec.Process.Env {
		if v, ok := strings.CutPrefix(kv, "LD_PRELOAD="); ok {
			ldPreload = v
		}
	}
	if ldPreload == "" {
		t.Fatalf("the container gets no LD_PRELOAD: %v", spec.Process.Env)
	}

	// A container root with glibc's loader, libc, env and true.
	root := filepath.Join(work, "root")
	copyFile := func(from, to string) {
		t.Helper()
		data, err := os.ReadFile(from)
		if err != nil {
			t.Fatalf("copying %s into the test root: %v", from, err)
		}
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, bin := range []string{"/usr/bin/env", "/usr/bin/true"} {
		copyFile(bin, filepath.Join(root, bin))
		out, err := exec.Command("ldd", bin).Output()
		if err != nil {
			t.Fatalf("%s is not dynamically linked here: %v", bin, err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			for _, f := range strings.Fields(line) {
				if strings.HasPrefix(f, "/") {
					copyFile(f, filepath.Join(root, f))
				}
			}
		}
	}

	run := func(t *testing.T, withPreloadFile bool, argv ...string) string {
		t.Helper()
		var script []string
		for _, m := range spec.Mounts {
			if m.Destination == enforce.LDSoPreload && !withPreloadFile {
				continue
			}
			if m.Destination != enforce.LDSoPreload && !strings.HasPrefix(m.Destination, enforce.InterposerDir) {
				continue
			}
			dst := filepath.Join(root, m.Destination)
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			script = append(script, fmt.Sprintf("mount --bind %q %q && mount -o remount,bind,ro %q %q", m.Source, dst, m.Source, dst))
		}
		if withPreloadFile && len(script) != 2 {
			t.Fatalf("the spec mounts %d of the library and the preload file, want both: %+v", len(script), spec.Mounts)
		}
		quoted := make([]string, len(argv))
		for i, a := range argv {
			quoted[i] = fmt.Sprintf("%q", a)
		}
		script = append(script, fmt.Sprintf("exec chroot %q %s", root, strings.Join(quoted, " ")))
		cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", strings.Join(script, " && "))
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("running in a private mount namespace: %v\n%s", err, out)
		}
		return string(out)
	}
	for _, tt := range []struct {
		name        string
		preloadFile bool
		argv        []string
		want        string
		absent      string
	}{
		{"LD_PRELOAD as the container has it", true,
			[]string{"/usr/bin/env", "LD_PRELOAD=" + ldPreload, "/usr/bin/true"}, "comm=true ld_preload=" + ldPreload, ""},
		{"LD_PRELOAD unset", true,
			[]string{"/usr/bin/env", "LD_PRELOAD=" + ldPreload, "/usr/bin/env", "-u", "LD_PRELOAD", "/usr/bin/true"}, "comm=true ld_preload=<unset>", ""},
		{"empty environment", true,
			[]string{"/usr/bin/env", "-i", "/usr/bin/true"}, "comm=true ld_preload=<unset>", ""},
		{"control: LD_PRELOAD unset without the preload file", false,
			[]string{"/usr/bin/env", "LD_PRELOAD=" + ldPreload, "/usr/bin/env", "-u", "LD_PRELOAD", "/usr/bin/true"}, "comm=env ld_preload=" + ldPreload, "comm=true"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out := run(t, tt.preloadFile, tt.argv...)
			t.Logf("%s", out)
			if !strings.Contains(out, tt.want) {
				t.Errorf("output %q lacks %q", out, tt.want)
			}
			if tt.absent != "" && strings.Contains(out, tt.absent) {
				t.Errorf("output %q has %q", out, tt.absent)
			}
		})
	}
	e.unprepare(c)
	e.assertClean()
}
