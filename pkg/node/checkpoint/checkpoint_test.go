package checkpoint

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/pkg/node/mig"
)

func claim(uid string) *Claim {
	return &Claim{
		UID: uid, Namespace: "ns", Name: "c-" + uid, State: PrepareCompleted, Fingerprint: "f", SpecName: "s.json",
		Devices: []Device{{Request: "r", Pool: "node", Device: "gpu-0-mig-1g5gb-0", CDIDeviceID: "k/c=x", Type: "mig",
			MIG: &mig.Instance{GPUUUID: "GPU-1", GIID: 1, CIID: 0, Created: true}}},
	}
}

func TestPutGetLoadDelete(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, "boot-1")
	if err != nil {
		t.Fatal(err)
	}
	a, b := claim("a"), claim("b")
	b.State = PrepareStarted
	for _, c := range []*Claim{a, b} {
		if err := s.Put(c); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Get("a")
	if err != nil || !reflect.DeepEqual(got, a) {
		t.Fatalf("get: %+v %v", got, err)
	}
	if got, err := s.Get("missing"); got != nil || err != nil {
		t.Fatalf("missing: %v %v", got, err)
	}
	loaded, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(loaded.Claims) != 2 || len(loaded.Corrupt) != 0 || len(loaded.Stale) != 0 {
		t.Fatalf("loaded %+v", loaded)
	}
	if err := s.Delete("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("a"); err != nil {
		t.Fatalf("deleting twice: %v", err)
	}
	// After a reboot the records are stale.
	s2, _ := Open(dir, "boot-2")
	loaded, err = s2.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(loaded.Stale) != 1 || loaded.Stale[0].UID != "b" || len(loaded.Claims) != 0 {
		t.Fatalf("after reboot %+v", loaded)
	}
	if _, err := s2.Get("b"); err == nil {
		t.Error("stale record returned")
	}
}

func TestCorruptRecords(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir, "boot")
	for _, uid := range []string{"good", "flipped", "renamed"} {
		if err := s.Put(claim(uid)); err != nil {
			t.Fatal(err)
		}
	}
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A flipped byte inside the claim breaks the checksum.
	data, _ := os.ReadFile(filepath.Join(dir, "flipped.json"))
	write("flipped.json", strings.Replace(string(data), `\"c-flipped\"`, `\"c-flipped!\"`, 1))
	data, _ = os.ReadFile(filepath.Join(dir, "flipped.json"))
	write("flipped.json", strings.Replace(string(data), `c-flipped`, `c-fl1pped`, 1))
	// A record under another claim's name.
	if err := os.Rename(filepath.Join(dir, "renamed.json"), filepath.Join(dir, "other.json")); err != nil {
		t.Fatal(err)
	}
	write("garbage.json", "{not json")
	write("empty.json", "")
	write("future.json", `{"version":99,"bootID":"boot","checksum":"","claim":{}}`)
	write("noversion.json", `{"bootID":"boot","checksum":"","claim":{}}`)
	write("inverted.json", `{"version":2,"formatVersion":1,"bootID":"boot","checksum":"","claim":{}}`)
	write(".x.json.tmp-123", "partial")
	write("README", "not a record")

	loaded, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(loaded.Claims) != 1 || loaded.Claims[0].UID != "good" {
		t.Errorf("good claims %+v", loaded.Claims)
	}
	bad := map[string]bool{}
	for _, c := range loaded.Corrupt {
		bad[c.UID] = true
	}
	for _, uid := range []string{"flipped", "other", "garbage", "empty", "noversion", "inverted"} {
		if !bad[uid] {
			t.Errorf("%s not reported corrupt: %+v", uid, loaded.Corrupt)
		}
	}
	// A newer format is not corrupt: it is kept for the plugin that
	// reads it.
	if bad["future"] || len(loaded.Newer) != 1 || loaded.Newer[0].UID != "future" {
		t.Errorf("record of a newer format: corrupt %v, newer %+v", bad["future"], loaded.Newer)
	}
	if _, err := os.Stat(filepath.Join(dir, ".x.json.tmp-123")); !os.IsNotExist(err) {
		t.Error("temporary file of an interrupted write left")
	}
	aside, err := s.Quarantine("garbage")
	if err != nil || !strings.Contains(aside, "garbage.json.corrupt-") {
		t.Fatalf("quarantine: %s %v", aside, err)
	}
	loaded, _ = s.Load()
	for _, c := range loaded.Corrupt {
		if c.UID == "garbage" {
			t.Error("quarantined record read again")
		}
	}
}

func TestReadBootID(t *testing.T) {
	p := filepath.Join(t.TempDir(), "boot_id")
	if got := ReadBootID(p); got != "unknown" {
		t.Errorf("missing file: %s", got)
	}
	_ = os.WriteFile(p, []byte("abc-123\n"), 0o644)
	if got := ReadBootID(p); got != "abc-123" {
		t.Errorf("got %q", got)
	}
}
