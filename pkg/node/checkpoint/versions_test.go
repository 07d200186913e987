package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-dev/tessera/pkg/node/mig"
)

// goldenUID is the claim of testdata/v1-<uid>.json, written by the
// format-1 plugin's Store.Put.
const goldenUID = "0f3c1a9e-golden-v1"

// goldenV1 is what the golden file records.
func goldenV1() *ClaimV1 {
	return &ClaimV1{
		UID: goldenUID, Namespace: "team-a", Name: "train", State: PrepareCompleted, Fingerprint: "9b1d2c", SpecName: "k8s.gpu.tessera.dev-claim_0f3c1a9e-golden-v1.json",
		AccountingDir: "/var/lib/tessera/accounting/0f3c1a9e-golden-v1",
		MPS:           &MPS{PipeDir: "/var/lib/tessera/mps/0f3c1a9e-golden-v1", Devices: []MPSDevice{{UUID: "GPU-1", MemMiB: 4096}}, ThreadPercent: 30},
		Devices: []Device{
			{Request: "gpu", Pool: "node-1", Device: "gpu-0", ShareID: "share-1", CDIDeviceID: "k8s.gpu.tessera.dev/claim=0f3c1a9e-golden-v1-gpu-0-share-1", Type: "gpu", GPUUUID: "GPU-1", UUID: "GPU-1", Memory: 4 << 30, Cores: 30, Mode: "interposer", Enforced: "interposer", TimeSliceInterval: "Short"},
			{Request: "mig", Pool: "node-1", Device: "gpu-1-mig-1g10gb-3", CDIDeviceID: "k8s.gpu.tessera.dev/claim=0f3c1a9e-golden-v1-gpu-1-mig-1g10gb-3", Type: "mig", GPUUUID: "GPU-2", UUID: "MIG-7", Memory: 10 << 30, Mode: "mig", Enforced: "hard",
				MIG: &mig.Instance{GPUUUID: "GPU-2", GPUMinor: 1, Profile: "1g.10gb", GIProfileID: 19, CIProfileID: 0, Start: 3, Size: 1, GIID: 9, CIID: 0, UUID: "MIG-7", Created: true}},
		},
		Pods: []Pod{{UID: "pod-uid-1", Name: "trainer-0"}},
		Spec: &cdispec.Spec{Version: "0.5.0", Kind: "k8s.gpu.tessera.dev/claim", Devices: []cdispec.Device{{Name: "0f3c1a9e-golden-v1-gpu-0-share-1", ContainerEdits: cdispec.ContainerEdits{Env: []string{"A=1"}}}}},
	}
}

// full is a current record with every field set, format 2's included.
func full(uid string) *Claim {
	c := ConvertV1(goldenV1())
	c.UID = uid
	c.PreparedBy = "github.com/tessera-dev/tessera@v0.9.0+0123456789ab"
	c.PreloadFile = "/var/lib/tessera/claims/" + uid + "/ld.so.preload"
	return c
}

func copyGolden(t *testing.T, dir string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "v1-"+goldenUID+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, goldenUID+".json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestRoundTrip(t *testing.T) {
	minimal := &Claim{UID: "min", State: PrepareStarted, Devices: []Device{}}
	started := full("started")
	started.State = PrepareStarted
	started.Devices[1].MIG.GIID, started.Devices[1].MIG.CIID, started.Devices[1].MIG.UUID = -1, -1, ""
	for _, tc := range []struct {
		name  string
		claim *Claim
	}{
		{"minimal", minimal},
		{"full", full("full")},
		{"started with MIG intent", started},
		{"converted from format 1", ConvertV1(goldenV1())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, _ := Open(dir, "boot")
			if err := s.Put(tc.claim); err != nil {
				t.Fatal(err)
			}
			got, err := s.Get(tc.claim.UID)
			if err != nil || !reflect.DeepEqual(got, tc.claim) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.claim)
			}
			data, _ := os.ReadFile(filepath.Join(dir, tc.claim.UID+".json"))
			f, err := parseFile(data)
			if err != nil || f.Version != ReadableBy || f.FormatVersion != Version {
				t.Fatalf("envelope %+v %v: want version %d, formatVersion %d", f, err, ReadableBy, Version)
			}
		})
	}
}

// TestReadOlderFormats: every older format is read and converted.
func TestReadOlderFormats(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(t *testing.T, dir string)
		want  *Claim
	}{
		{"golden format-1 file", copyGolden, ConvertV1(goldenV1())},
		{"format-1 plugin's Put", func(t *testing.T, dir string) {
			c := goldenV1()
			c.UID = "by-v1"
			if err := (&v1Store{dir: dir, bootID: "boot"}).Put(c); err != nil {
				t.Fatal(err)
			}
		}, func() *Claim { c := ConvertV1(goldenV1()); c.UID = "by-v1"; return c }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.write(t, dir)
			bootID := "boot"
			if tc.want.UID == goldenUID {
				bootID = "boot-golden"
			}
			s, _ := Open(dir, bootID)
			loaded, err := s.Load()
			if err != nil {
				t.Fatal(err)
			}
			if len(loaded.Claims) != 1 || len(loaded.Corrupt) != 0 || len(loaded.Newer) != 0 {
				t.Fatalf("loaded %+v", loaded)
			}
			if got := loaded.Claims[0]; !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if got := loaded.Claims[0]; got.PreparedBy != "" || got.PreloadFile != "" {
				t.Errorf("format-1 record has format-2 fields: %+v", got)
			}
		})
	}
}

// TestOlderReaderReadsNewFiles: a format-1 plugin (its code kept as a
// fixture) reads what this one writes, all of format 1's fields intact.
func TestOlderReaderReadsNewFiles(t *testing.T) {
	for _, tc := range []struct {
		name  string
		claim *Claim
	}{
		{"full", full("full")},
		{"without format-2 fields", ConvertV1(goldenV1())},
		{"started", func() *Claim { c := full("started"); c.State = PrepareStarted; return c }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, _ := Open(dir, "boot")
			if err := s.Put(tc.claim); err != nil {
				t.Fatal(err)
			}
			old := &v1Store{dir: dir, bootID: "boot"}
			got, boot, err := old.read(old.path(tc.claim.UID))
			if err != nil {
				t.Fatalf("format-1 reader: %v", err)
			}
			if boot != "boot" || !reflect.DeepEqual(got, tc.claim.V1()) {
				t.Fatalf("format-1 reader got %+v (boot %s), want %+v", got, boot, tc.claim.V1())
			}
		})
	}
}

// TestSeamlessUpgradeAndDowngrade: a format-1 and a format-2 plugin share
// one checkpoint directory (the old and new pod of a rolling update, in
// either direction) and each reads, rewrites and deletes the other's
// records.
func TestSeamlessUpgradeAndDowngrade(t *testing.T) {
	type step struct {
		who  string // "old" (format 1) or "new" (format 2)
		op   string // put, addPod, delete
		uid  string
		want string // the new plugin's view afterwards: "", "v1" (no format-2 fields), "v2"
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"upgrade: old prepares, new unprepares", []step{
			{"old", "put", "a", "v1"},
			{"new", "delete", "a", ""},
		}},
		{"upgrade: old prepares, new prepares again for another pod", []step{
			{"old", "put", "a", "v1"},
			{"new", "addPod", "a", "v1"},
			{"old", "addPod", "a", "v1"},
			{"old", "delete", "a", ""},
		}},
		{"downgrade: new prepares, old unprepares", []step{
			{"new", "put", "b", "v2"},
			{"old", "delete", "b", ""},
		}},
		{"downgrade: new prepares, old rewrites (format-2 fields lost), new unprepares", []step{
			{"new", "put", "b", "v2"},
			{"old", "addPod", "b", "v1"},
			{"new", "addPod", "b", "v1"},
			{"new", "delete", "b", ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			newS, _ := Open(dir, "boot")
			oldS := &v1Store{dir: dir, bootID: "boot"}
			pods := 1
			for i, st := range tc.steps {
				switch st.who + "/" + st.op {
				case "old/put":
					c := full(st.uid).V1()
					if err := oldS.Put(c); err != nil {
						t.Fatal(err)
					}
				case "new/put":
					if err := newS.Put(full(st.uid)); err != nil {
						t.Fatal(err)
					}
				case "old/addPod":
					c, err := oldS.Get(st.uid)
					if err != nil {
						t.Fatalf("step %d: format-1 plugin cannot read: %v", i, err)
					}
					c.Pods = append(c.Pods, Pod{UID: "p", Name: "p"})
					pods++
					if err := oldS.Put(c); err != nil {
						t.Fatal(err)
					}
				case "new/addPod":
					c, err := newS.Get(st.uid)
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					c.Pods = append(c.Pods, Pod{UID: "q", Name: "q"})
					pods++
					if err := newS.Put(c); err != nil {
						t.Fatal(err)
					}
				case "old/delete":
					if _, err := oldS.Get(st.uid); err != nil {
						t.Fatalf("step %d: format-1 plugin cannot read before unprepare: %v", i, err)
					}
					if err := os.Remove(oldS.path(st.uid)); err != nil {
						t.Fatal(err)
					}
				case "new/delete":
					if err := newS.Delete(st.uid); err != nil {
						t.Fatal(err)
					}
				}
				loaded, err := newS.Load()
				if err != nil || len(loaded.Corrupt) != 0 || len(loaded.Newer) != 0 {
					t.Fatalf("step %d: loaded %+v %v", i, loaded, err)
				}
				if st.want == "" {
					if len(loaded.Claims) != 0 {
						t.Fatalf("step %d: record left: %+v", i, loaded.Claims)
					}
					continue
				}
				if len(loaded.Claims) != 1 {
					t.Fatalf("step %d: %d records", i, len(loaded.Claims))
				}
				got := loaded.Claims[0]
				want := full(st.uid)
				if st.want == "v1" {
					want = ConvertV1(want.V1())
				}
				if len(got.Pods) != pods {
					t.Fatalf("step %d: %d pods, want %d", i, len(got.Pods), pods)
				}
				got.Pods = want.Pods
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d: got %+v, want %+v", i, got, want)
				}
				// The old plugin reads it at every step too.
				if _, err := oldS.Get(st.uid); err != nil {
					t.Fatalf("step %d: format-1 plugin cannot read: %v", i, err)
				}
			}
		})
	}
}

// TestNewerFormats: records of a newer format are kept, neither read as
// corrupt nor overwritten or removed; a newer format that only adds fields
// (its version still this plugin's) is read.
func TestNewerFormats(t *testing.T) {
	claimJSON := `{"uid":"%s","namespace":"ns","name":"n","state":"PrepareCompleted","fingerprint":"f","specName":"s","devices":[],"addedInFormat3":{"x":1}}`
	envelope := func(version, format int, uid string) string {
		raw := strings.Replace(claimJSON, "%s", uid, 1)
		f := file{Version: version, FormatVersion: format, BootID: "boot", Claim: []byte(raw)}
		sum := sha256Hex([]byte(raw))
		f.Checksum = sum
		data, _ := jsonMarshal(f)
		return string(data)
	}
	for _, tc := range []struct {
		name     string
		data     string
		readable bool
	}{
		{"format 3 readable by format 2", envelope(2, 3, "x"), true},
		{"format 3 readable by format 1", envelope(1, 3, "x"), true},
		{"format 3 needing a format-3 reader", envelope(3, 3, "x"), false},
		{"format 7 needing a format-5 reader", envelope(5, 7, "x"), false},
		{"needs a newer reader, claim unparsable to this one", `{"version":99,"formatVersion":99,"bootID":"boot","checksum":"","claim":["new shape"]}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "x.json")
			if err := os.WriteFile(p, []byte(tc.data), 0o600); err != nil {
				t.Fatal(err)
			}
			s, _ := Open(dir, "boot")
			loaded, err := s.Load()
			if err != nil || len(loaded.Corrupt) != 0 {
				t.Fatalf("loaded %+v %v", loaded, err)
			}
			if tc.readable {
				if len(loaded.Claims) != 1 || loaded.Claims[0].UID != "x" || len(loaded.Newer) != 0 {
					t.Fatalf("loaded %+v", loaded)
				}
				return
			}
			if len(loaded.Newer) != 1 || loaded.Newer[0].UID != "x" || len(loaded.Claims) != 0 {
				t.Fatalf("loaded %+v", loaded)
			}
			if _, err := s.Get("x"); !IsNewer(err) {
				t.Errorf("get: %v", err)
			}
			if err := s.Put(&Claim{UID: "x", State: PrepareCompleted}); !IsNewer(err) || !strings.Contains(err.Error(), "claim x") {
				t.Errorf("put over a newer record: %v", err)
			}
			if err := s.Delete("x"); !IsNewer(err) {
				t.Errorf("delete of a newer record: %v", err)
			}
			if got, _ := os.ReadFile(p); !bytes.Equal(got, []byte(tc.data)) {
				t.Errorf("newer record changed: %s", got)
			}
			if err := s.DeleteStale("x"); err == nil {
				t.Error("DeleteStale removed a record of this boot")
			}
			if loaded.Newer[0].Stale {
				t.Error("record of this boot reported stale")
			}
			// After a reboot it is stale, and may go.
			rebooted, _ := Open(dir, "boot-2")
			loaded, _ = rebooted.Load()
			if len(loaded.Newer) != 1 || !loaded.Newer[0].Stale {
				t.Fatalf("after a reboot: %+v", loaded.Newer)
			}
			if err := rebooted.DeleteStale("x"); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("stale newer record left: %v", err)
			}
		})
	}
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }
