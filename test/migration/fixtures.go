// Package migration holds manifests written for the NVIDIA device plugin,
// HAMi and KAI (fixtures/) and what Tessera's translation makes of each on
// the local cluster's GPUs (two T4s): the unit test here checks the
// translation offline, test/e2e (TestMigrationFixtures) runs them.
package migration

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// T4UsableMiB is the usable memory Tessera publishes for a mock T4 (15360
// MiB less the 256 MiB reserve): the base of fractions on the local cluster.
const T4UsableMiB = 15104

// Expect is what one fixture becomes.
type Expect struct {
	// File is the fixture, relative to fixtures/.
	File string
	// Pods is how many pods it makes (a Job's parallelism).
	Pods int
	// Count devices of Class each; MemMiB and Cores per device (0: a
	// whole GPU, no memory asked; no cores asked).
	Class  string
	Count  int
	MemMiB int64
	Cores  int64
	// KAIQueue: the pod names KAI's queue default-queue (mapped by the
	// chart's translation.queueNames); else it gets the namespace's.
	KAIQueue bool
	// Refused: the pod is refused at creation with this in the message.
	Refused string
}

// Whole says whether the devices are whole GPUs.
func (e Expect) Whole() bool { return e.MemMiB == 0 }

// Fixtures lists every fixture with what it becomes on two T4s, with the
// chart's translation on (devicePlugin whole).
var Fixtures = []Expect{
	{File: "device-plugin/gpu-pod.yaml", Pods: 1, Class: "gpu.tessera.dev", Count: 1},
	{File: "device-plugin/job-1.yaml", Pods: 1, Class: "gpu.tessera.dev", Count: 1},
	{File: "hami/default_use.yaml", Pods: 1, Class: "gpu.tessera.dev", Count: 1, MemMiB: 3000, Cores: 30},
	{File: "hami/use_memory_fraction.yaml", Pods: 1, Class: "gpu.tessera.dev", Count: 2, MemMiB: T4UsableMiB / 2, Cores: 30},
	{File: "hami/use_exclusive_card.yaml", Pods: 1, Class: "gpu.tessera.dev", Count: 2},
	{File: "hami/specify_card_type_to_use.yaml", Refused: "metadata.annotations[nvidia.com/use-gputype]"},
	{File: "kai/gpu-pod.yaml", Pods: 1, Class: "gpu.tessera.dev", Count: 1, KAIQueue: true},
	{File: "kai/gpu-sharing.yaml", Pods: 1, Class: "gpu.tessera.dev", Count: 1, MemMiB: (T4UsableMiB + 1) / 2, KAIQueue: true},
	{File: "kai/gpu-memory.yaml", Pods: 1, Class: "gpu.tessera.dev", Count: 1, MemMiB: 2000, KAIQueue: true},
	{File: "kai/batch-job.yaml", Pods: 2, Class: "gpu.tessera.dev", Count: 1, KAIQueue: true},
}

// Dir is the fixtures directory.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "fixtures")
}

// Load reads a fixture: a Pod, or a Job (whose pod template the Job
// controller will turn into pods).
func Load(file string) (*corev1.Pod, *batchv1.Job, error) {
	data, err := os.ReadFile(filepath.Join(Dir(), file))
	if err != nil {
		return nil, nil, err
	}
	var meta struct {
		Kind string `json:"kind"`
	}
	if err := yaml.Unmarshal(data, &meta); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", file, err)
	}
	switch meta.Kind {
	case "Pod":
		p := &corev1.Pod{}
		if err := yaml.UnmarshalStrict(data, p); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", file, err)
		}
		return p, nil, nil
	case "Job":
		j := &batchv1.Job{}
		if err := yaml.UnmarshalStrict(data, j); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", file, err)
		}
		return nil, j, nil
	}
	return nil, nil, fmt.Errorf("%s: kind %q, want Pod or Job", file, meta.Kind)
}

// PodOf is the pod a fixture makes as the API server sees it at creation:
// the Pod, or the Job's template as a pod; requests defaulted from limits
// (the API server does that before webhooks run).
func PodOf(p *corev1.Pod, j *batchv1.Job) *corev1.Pod {
	if j != nil {
		p = &corev1.Pod{ObjectMeta: *j.Spec.Template.ObjectMeta.DeepCopy(), Spec: *j.Spec.Template.Spec.DeepCopy()}
		p.GenerateName = j.Name + "-"
	}
	p = p.DeepCopy()
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		for k, v := range c.Resources.Limits {
			if c.Resources.Requests == nil {
				c.Resources.Requests = corev1.ResourceList{}
			}
			if _, ok := c.Resources.Requests[k]; !ok {
				c.Resources.Requests[k] = v
			}
		}
	}
	return p
}

// Localize replaces what the local cluster cannot run (no registry): each
// container's image by the local busybox (never pulled), its command by
// one that prints the GPU environment and sleeps. Nothing else changes.
func Localize(spec *corev1.PodSpec, busybox string) {
	for i := range spec.Containers {
		c := &spec.Containers[i]
		c.Image, c.ImagePullPolicy = busybox, corev1.PullNever
		c.Command = []string{"sh", "-c", "env | grep -E 'TESSERA|CUDA|NVIDIA' | sort; exec sleep 3600"}
		c.Args = nil
	}
}

// Equal reports whether two objects marshal alike (a fixture unchanged).
func Equal(a, b any) bool {
	x, _ := yaml.Marshal(a)
	y, _ := yaml.Marshal(b)
	return bytes.Equal(x, y)
}
