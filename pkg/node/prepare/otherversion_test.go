package prepare

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/pkg/node/checkpoint"
)

// TestOtherVersionUnprepares: a claim prepared by one plugin version is
// unprepared by another, as when a node moves between the main and the
// canary DaemonSet (or a rollback replaces the plugin). The claim is
// prepared, its checkpoint record is rewritten as the other version
// writes it, the plugin restarts (recovers from the node's files) and
// unprepares: the CDI spec, the checkpoint record and every other file of
// the claim go.
func TestOtherVersionUnprepares(t *testing.T) {
	for _, tc := range []struct {
		name string
		// rewrite turns this build's record (claim JSON) into the other
		// version's file.
		rewrite func(t *testing.T, claim []byte) []byte
	}{
		{"this version", nil},
		{"older version (format 1: no formatVersion, no format-2 fields)", func(t *testing.T, raw []byte) []byte {
			var c checkpoint.Claim
			if err := json.Unmarshal(raw, &c); err != nil {
				t.Fatal(err)
			}
			if c.PreparedBy == "" {
				t.Fatal("this build's record lacks preparedBy: the test would not tell format 1 from format 2")
			}
			v1, err := json.Marshal(c.V1())
			if err != nil {
				t.Fatal(err)
			}
			return envelope(t, map[string]any{"version": 1}, v1)
		}},
		{"newer version (format 3 readable by format 1, with a field this build does not know)", func(t *testing.T, raw []byte) []byte {
			var m map[string]any
			if err := json.Unmarshal(raw, &m); err != nil {
				t.Fatal(err)
			}
			m["addedInFormat3"] = map[string]any{"x": 1}
			v3, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			return envelope(t, map[string]any{"version": 1, "formatVersion": 3}, v3)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, withTimeSlices(2))
			a := claim("a", share("gpu", "gpu-0", "s-1", 4*gib, 0))
			ids := e.prepare(a)
			if len(ids) == 0 {
				t.Fatal("no CDI devices")
			}
			if len(e.files("cdi")) == 0 || len(e.files("checkpoint")) != 1 {
				t.Fatalf("after prepare: cdi %v, checkpoint %v", e.files("cdi"), e.files("checkpoint"))
			}
			if tc.rewrite != nil {
				p := filepath.Join(e.dir, "checkpoint", string(a.UID)+".json")
				data, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				var f struct {
					Claim json.RawMessage `json:"claim"`
				}
				if err := json.Unmarshal(data, &f); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, tc.rewrite(t, f.Claim), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			// The other plugin starts on the node and recovers the claim.
			e.start()
			if got := e.p.Prepared(); len(got) != 1 {
				t.Fatalf("after the restart the plugin knows %v, want claim a", got)
			}
			// The container runtime still finds the devices.
			e.inject(ids...)
			// Preparing again (the kubelet's retry) is idempotent.
			if again := e.prepare(a); strings.Join(again, ",") != strings.Join(ids, ",") {
				t.Errorf("prepared again: %v, want %v", again, ids)
			}
			e.unprepare(a)
			e.assertClean()
		})
	}
}

// TestOlderReaderFindsClaimFiles: what a format-1 plugin reads of this
// build's record (ClaimV1, unknown fields ignored) names the claim's CDI
// spec and accounting directory, so an older plugin can unprepare a claim
// this one prepared.
func TestOlderReaderFindsClaimFiles(t *testing.T) {
	e := newEnv(t)
	a := claim("a", share("gpu", "gpu-0", "s-1", 4*gib, 0))
	e.prepare(a)
	data, err := os.ReadFile(filepath.Join(e.dir, "checkpoint", string(a.UID)+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Version int             `json:"version"`
		Claim   json.RawMessage `json:"claim"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	if f.Version != 1 {
		t.Fatalf("envelope version %d: a format-1 plugin refuses it", f.Version)
	}
	var v1 checkpoint.ClaimV1
	if err := json.Unmarshal(f.Claim, &v1); err != nil {
		t.Fatal(err)
	}
	specs := e.files("cdi")
	if len(specs) != 1 {
		t.Fatalf("CDI specs %v, want one", specs)
	}
	if v1.UID != string(a.UID) || v1.State != checkpoint.PrepareCompleted || v1.Spec == nil || len(v1.Devices) == 0 {
		t.Fatalf("format-1 view %+v lacks what unprepare needs", v1)
	}
	if !strings.Contains(specs[0], v1.SpecName) {
		t.Errorf("format-1 view names spec %q; the CDI directory holds %v", v1.SpecName, specs)
	}
}

// envelope is a checkpoint file with the given envelope fields around
// claim, with its checksum.
func envelope(t *testing.T, fields map[string]any, claim []byte) []byte {
	t.Helper()
	sum := sha256.Sum256(claim)
	fields["bootID"] = "boot-1"
	fields["checksum"] = hex.EncodeToString(sum[:])
	fields["claim"] = json.RawMessage(claim)
	data, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
