package migration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/webhook"
)

// TestFixtures translates every fixture offline, with the chart's
// translation on two T4s, and checks what Fixtures says it becomes; every
// file under fixtures/ is listed, and each file's "# expect:" comment is
// there for the reader.
func TestFixtures(t *testing.T) {
	cfg := webhook.TranslateConfig{Driver: "gpu.tessera.dev", GPUClass: "gpu.tessera.dev", TimeSliceClass: "timeslice.tessera.dev",
		DevicePlugin: webhook.DevicePluginWhole, QueueNames: map[string]string{"default-queue": "migration"}, SchedulerNames: []string{"kai-scheduler"}}
	inv := webhook.Inventory{MemoryMiB: []int64{T4UsableMiB}, Products: []string{"Tesla T4"}}
	listed := map[string]bool{}
	for _, fx := range Fixtures {
		listed[fx.File] = true
		t.Run(fx.File, func(t *testing.T) {
			p, j, err := Load(fx.File)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := os.ReadFile(filepath.Join(Dir(), fx.File))
			if !strings.Contains(string(raw), "# expect:") {
				t.Error("no # expect: comment")
			}
			pod := PodOf(p, j)
			pod.Namespace = "ns"
			tr, err := cfg.Translate(pod, inv)
			if fx.Refused != "" {
				if err == nil || !strings.Contains(err.Error(), fx.Refused) {
					t.Fatalf("error %v, want refused with %q", err, fx.Refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tr.Pod == nil || len(tr.Templates) != 1 {
				t.Fatalf("translated %v templates %d", tr.Pod != nil, len(tr.Templates))
			}
			if q := tr.Pod.Labels[v1alpha1.QueueLabel]; fx.KAIQueue != (q == "migration") {
				t.Errorf("queue label %q (KAI queue %v)", q, fx.KAIQueue)
			}
			if fx.KAIQueue && tr.Pod.Spec.SchedulerName != "" {
				t.Errorf("schedulerName %q kept", tr.Pod.Spec.SchedulerName)
			}
			r := tr.Templates[0].Spec.Spec.Devices.Requests[0].Exactly
			if r.DeviceClassName != fx.Class || r.Count != int64(fx.Count) {
				t.Errorf("%s x%d, want %s x%d", r.DeviceClassName, r.Count, fx.Class, fx.Count)
			}
			var mem, cores int64
			if r.Capacity != nil {
				if q, ok := r.Capacity.Requests["memory"]; ok {
					mem = q.Value() >> 20
				}
				if q, ok := r.Capacity.Requests["cores"]; ok {
					cores = q.Value()
				}
			}
			if mem != fx.MemMiB || cores != fx.Cores {
				t.Errorf("memory %dMi cores %d, want %dMi %d", mem, cores, fx.MemMiB, fx.Cores)
			}
		})
	}
	err := filepath.WalkDir(Dir(), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		rel, _ := filepath.Rel(Dir(), path)
		if !listed[rel] {
			t.Errorf("fixture %s is not in Fixtures", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
