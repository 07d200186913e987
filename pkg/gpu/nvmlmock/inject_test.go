package nvmlmock

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestInjectFromFile(t *testing.T) {
	spec, err := ParseProfile("t4:2")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Spec: spec, Seed: "n"})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), InjectFileName)
	if err := s.injectFromFile(path); err != nil {
		t.Fatalf("missing file: %v", err)
	}
	content := "# comment\n1 79\n" + s.Devices()[0].UUID + " 48 3\nbogus\n9 79\n"
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.injectFromFile(path); err == nil {
		t.Error("bad lines not reported")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Error("file not consumed")
	}
	es, _ := s.EventSetCreate()
	ev, ret := es.Wait(100)
	if ret != nvml.SUCCESS || ev.EventData != 79 || ev.Device.(*Device).Index != 1 || ev.GpuInstanceId != 0xFFFFFFFF {
		t.Fatalf("first event %+v %v", ev, ret)
	}
	ev, ret = es.Wait(100)
	if ret != nvml.SUCCESS || ev.EventData != 48 || ev.Device.(*Device).Index != 0 || ev.GpuInstanceId != 3 {
		t.Fatalf("second event %+v %v", ev, ret)
	}
	if _, ret := es.Wait(10); ret != nvml.ERROR_TIMEOUT {
		t.Fatalf("more events: %v", ret)
	}
}
