package prepare

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/node/cdispec"
	"github.com/tessera-dev/tessera/pkg/node/checkpoint"
	"github.com/tessera-dev/tessera/pkg/node/enforce"
)

// TestPreloadFile: in interposer mode with a library, prepare writes the
// claim's ld.so.preload under the plugin data directory and its spec
// mounts it read-only at /etc/ld.so.preload; prepare again is idempotent
// and rewrites a file that went missing, so does a restart; unprepare
// removes it.
func TestPreloadFile(t *testing.T) {
	lib := filepath.Join(t.TempDir(), "libvgpu.so")
	const want = "/usr/local/tessera/lib/libvgpu.so\n"
	for _, tt := range []struct {
		name    string
		opts    []envOption
		claim   *resourceapi.ResourceClaim
		preload bool
	}{
		{"share with the node's interposer library", []envOption{withInterposer(lib)}, claim("a", share("gpu", "gpu-0", "s-1", 4*gib, 25)), true},
		{"time slice with the node's interposer library", []envOption{withInterposer(lib), withTimeSlices(2)}, claim("t", device("ts", "gpu-1-ts-1")), true},
		{"interposer mode without a library", nil, withConfig(claim("n", share("gpu", "gpu-0", "s-1", 4*gib, 0)), resourceapi.AllocationConfigSourceClaim, nil, `"enforcement":"interposer"`), false},
		{"whole GPU next to a library", []envOption{withInterposer(lib)}, claim("w", share("gpu", "gpu-1", "s-2", t4Usable, 0)), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.opts...)
			uid := string(tt.claim.UID)
			path := filepath.Join(e.dir, "claims", uid, "ld.so.preload")
			ids := e.prepare(tt.claim)
			env, _ := e.inject(ids...)
			var mounted []string
			for _, m := range e.lastMounts {
				if m.Destination == enforce.LDSoPreload {
					mounted = append(mounted, m.Source)
					if !slices.Contains(m.Options, "ro") {
						t.Errorf("%s mounted with %v, not read-only", m.Destination, m.Options)
					}
				}
			}
			rec := e.p.record(uid)
			if rec.PreparedBy != checkpoint.Build || rec.PreparedBy == "" {
				t.Errorf("preparedBy %q, want %q", rec.PreparedBy, checkpoint.Build)
			}
			if !tt.preload {
				if len(mounted) > 0 || rec.PreloadFile != "" {
					t.Fatalf("preload file mounted %v, recorded %q", mounted, rec.PreloadFile)
				}
				if _, err := os.Stat(filepath.Dir(path)); !os.IsNotExist(err) {
					t.Fatalf("claim files written: %v", err)
				}
				e.unprepare(tt.claim)
				e.assertClean()
				return
			}
			if !slices.Equal(mounted, []string{path}) || rec.PreloadFile != path {
				t.Fatalf("preload file mounted %v, recorded %q; want %s", mounted, rec.PreloadFile, path)
			}
			if env["LD_PRELOAD"] != strings.TrimSpace(want) {
				t.Errorf("LD_PRELOAD=%q", env["LD_PRELOAD"])
			}
			check := func(when string) {
				t.Helper()
				data, err := os.ReadFile(path)
				if err != nil || string(data) != want {
					t.Fatalf("%s: preload file %q %v, want %q", when, data, err, want)
				}
				if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
					t.Fatalf("%s: preload file mode %v %v: every user's loader must read it", when, fi.Mode(), err)
				}
			}
			check("prepared")
			specFile := filepath.Join(e.opts.CDI.Path, cdispec.SpecName(uid))
			before, _ := os.ReadFile(specFile)
			if again := e.prepare(tt.claim); !slices.Equal(again, ids) {
				t.Fatalf("prepare again: %v, want %v", again, ids)
			}
			check("prepared again")
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			e.prepare(tt.claim)
			check("prepared again after the file went missing")
			if after, _ := os.ReadFile(specFile); string(after) != string(before) {
				t.Error("spec changed on prepare again")
			}
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			e.start()
			check("restarted after the file went missing")
			e.unprepare(tt.claim)
			if _, err := os.Stat(filepath.Dir(path)); !os.IsNotExist(err) {
				t.Errorf("claim files left after unprepare: %v", err)
			}
			e.unprepare(tt.claim)
			e.assertClean()
		})
	}
}

// TestPreloadFileLeftovers: a claim's files without a record (a crash
// before its record, a lost checkpoint) go with the claim's other
// leftovers.
func TestPreloadFileLeftovers(t *testing.T) {
	lib := filepath.Join(t.TempDir(), "libvgpu.so")
	e := newEnv(t, withInterposer(lib))
	c := claim("a", share("gpu", "gpu-0", "s-1", 4*gib, 25))
	e.prepare(c)
	if err := e.opts.Checkpoints.Delete(string(c.UID)); err != nil {
		t.Fatal(err)
	}
	e.apiClaims = nil // gone from the API server
	e.start()
	e.assertClean()
}

// TestNewerCheckpointKept: a record in a checkpoint format newer than
// this plugin reads (written by a newer plugin) is not moved aside as
// corrupt or repaired away: it stays as it is, the devices its spec names
// stay held, and the claim's prepare and unprepare are refused until a
// plugin that reads it serves them.
func TestNewerCheckpointKept(t *testing.T) {
	lib := filepath.Join(t.TempDir(), "libvgpu.so")
	e := newEnv(t, withInterposer(lib))
	a := claim("a", share("gpu", "gpu-0", "s-1", 10*gib, 0))
	e.prepare(a)
	cpFile := filepath.Join(e.dir, "checkpoint", string(a.UID)+".json")
	original, err := os.ReadFile(cpFile)
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]any
	if err := json.Unmarshal(original, &f); err != nil {
		t.Fatal(err)
	}
	f["version"], f["formatVersion"] = checkpoint.Version+1, checkpoint.Version+1
	newer, _ := json.Marshal(f)
	if err := os.WriteFile(cpFile, newer, 0o600); err != nil {
		t.Fatal(err)
	}
	e.start()
	unchanged := func(when string) {
		t.Helper()
		if got, _ := os.ReadFile(cpFile); string(got) != string(newer) {
			t.Fatalf("%s: newer record changed", when)
		}
		if files := e.files("checkpoint"); len(files) != 1 {
			t.Fatalf("%s: checkpoint directory %v", when, files)
		}
		if !e.opts.CDI.Exists(cdispec.SpecName(string(a.UID))) {
			t.Fatalf("%s: spec of the claim removed", when)
		}
		if _, err := os.Stat(filepath.Join(e.dir, "claims", string(a.UID), "ld.so.preload")); err != nil {
			t.Fatalf("%s: preload file of the claim removed: %v", when, err)
		}
	}
	unchanged("after start")
	if p := e.p.Pending(); len(p) > 0 {
		t.Errorf("claim with a newer record waits for a repair: %v", p)
	}
	if _, err := e.p.Prepare(e.ctx, claim("c", share("gpu", "gpu-0", "s-2", 10*gib, 0))); err == nil || !strings.Contains(err.Error(), "oversubscribed") {
		t.Errorf("prepared a share next to the newer record's: %v", err)
	}
	if _, err := e.p.Prepare(e.ctx, a); !checkpoint.IsNewer(err) {
		t.Errorf("prepare of the claim: %v", err)
	}
	if err := e.p.Unprepare(e.ctx, types.NamespacedName{Namespace: a.Namespace, Name: a.Name}, a.UID); !checkpoint.IsNewer(err) {
		t.Errorf("unprepare of the claim: %v", err)
	}
	unchanged("after prepare and unprepare")
	// A plugin that reads the format (here: the record written back in
	// this one's) serves the claim again.
	if err := os.WriteFile(cpFile, original, 0o600); err != nil {
		t.Fatal(err)
	}
	e.start()
	e.unprepare(a)
	e.assertClean()

	// After a reboot a record in a newer format is stale like any other:
	// dropped with the claim's files.
	e.prepare(a)
	if err := os.WriteFile(cpFile, newer, 0o600); err != nil {
		t.Fatal(err)
	}
	e.bootID = "boot-2"
	e.start()
	e.assertClean()
}

// TestNewerCheckpointDuringSeamlessUpgrade: while both plugin processes
// serve, a record the other (newer) process rewrote in a newer format is
// picked up at the next call: held, never overwritten, its unprepare left
// to the newer process.
func TestNewerCheckpointDuringSeamlessUpgrade(t *testing.T) {
	e := newEnv(t, withSharedLock())
	a := claim("a", share("gpu", "gpu-0", "s-1", 10*gib, 0))
	e.call(e.p, "prepare a", func(p *Preparer) error {
		_, err := p.Prepare(e.ctx, a)
		return err
	})
	// The newer process rewrites the record in its format and says so.
	cpFile := filepath.Join(e.dir, "checkpoint", string(a.UID)+".json")
	data, _ := os.ReadFile(cpFile)
	var f map[string]any
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	f["version"], f["formatVersion"] = checkpoint.Version+1, checkpoint.Version+1
	newer, _ := json.Marshal(f)
	if err := os.WriteFile(cpFile, newer, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.dir, "checkpoint", ".generation"), []byte("by-the-newer-process\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var unprepareErr, prepareErr error
	e.call(e.p, "", func(p *Preparer) error {
		unprepareErr = p.Unprepare(e.ctx, types.NamespacedName{Namespace: a.Namespace, Name: a.Name}, a.UID)
		_, prepareErr = p.Prepare(e.ctx, claim("c", share("gpu", "gpu-0", "s-2", 10*gib, 0)))
		return nil
	})
	if !checkpoint.IsNewer(unprepareErr) {
		t.Errorf("unprepare of a claim with a newer record: %v", unprepareErr)
	}
	if prepareErr == nil || !strings.Contains(prepareErr.Error(), "oversubscribed") {
		t.Errorf("prepared next to a claim with a newer record: %v", prepareErr)
	}
	if got, _ := os.ReadFile(cpFile); string(got) != string(newer) {
		t.Error("newer record changed")
	}
}
