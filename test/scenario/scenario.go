// Package scenario runs the demo scenarios in demo/ against a cluster and
// reports where their claims landed and what their containers see. `make
// demo` (hack/demo) narrates them; the end-to-end tests (test/e2e) run the
// same YAML and assert on the same reports, so the demo cannot drift from
// what is tested.
//
// A scenario is a directory demo/<name> of plain YAML files, applied with
// kubectl in file-name order, one step per file. After each step every pod
// of the namespace must reach what its annotation demo.tessera.dev/expect
// says: Running (the default), Succeeded, or Pending (the scheduler has
// reported it unschedulable, or it is gated).
package scenario

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-dev/tessera/test/localcluster"
)

// ExpectAnnotation on a pod says what it should reach after its step.
const ExpectAnnotation = "demo.tessera.dev/expect"

// Driver is the DRA driver whose attributes are read.
const Driver = localcluster.DriverName

// Scenario is one directory of demo/.
type Scenario struct {
	// Name is the directory under demo/.
	Name  string
	Title string
	// Story is what the terminal says before the YAML is applied.
	Story []string
	// Plugin is how the kubelet plugin must run for this scenario.
	Plugin localcluster.PluginConfig
	// Controller says the scenario needs ./cmd/controller running.
	Controller bool
	// Optional scenarios run only when their directory has YAML files.
	Optional bool
	// After runs once every step is applied and shown (e.g. free capacity
	// and show a Pending pod start).
	After func(ctx context.Context, r *Run) error
}

// Scenarios are the demo's scenarios, in the order they run.
var Scenarios = []Scenario{
	{
		Name:  "showdown",
		Title: "the scheduler showdown: four workloads share one 16 GB T4",
		Story: []string{
			"inference 2000Mi x 2, training 8000Mi and preprocessing 3000Mi ask for memory shares;",
			"15000Mi in all fits the 15104Mi a T4 publishes (16 GB minus a 256Mi reserve): the node has one T4,",
			"gpu-0, and all four share it. Each container prints the limits the plugin gave it: they equal its share.",
			"Then what each really uses (the mock's processes use 600Mi to 5000Mi): allocated vs used, per claim.",
		},
		Plugin: localcluster.PluginConfig{Profile: "t4:1"},
		After:  showUsage,
	},
	{
		Name:  "whole-gpu",
		Title: "a whole GPU, exclusive",
		Story: []string{
			"A claim that names no capacity takes all of a GPU's memory: nothing else fits next to it.",
			"Then two 4Gi shares: one lands on the other GPU; one that insists on GPU 0 stays Pending",
			"until the exclusive pod goes.",
		},
		Plugin: localcluster.PluginConfig{Profile: "t4:2"},
		After:  freeExclusive,
	},
	{
		Name:  "timeslice",
		Title: "four time-slice partitions of one GPU",
		Story: []string{
			"The plugin publishes --time-slices=4 partitions of the node's one T4 (15104Mi / 4 = 3776Mi each).",
			"Four pods get the four partitions of gpu-0: same GPU, each its own partition and memory limit.",
		},
		Plugin: localcluster.PluginConfig{Profile: "t4:1", Args: []string{"--time-slices=4"}},
	},
	{
		Name:  "mig",
		Title: "MIG on a mock H100: 1g.10gb x 2 + 3g.40gb",
		Story: []string{
			"A mock H100 80GB in MIG mode publishes every profile at every placement (dynamic MIG).",
			"The plugin creates each MIG instance when it prepares the claim; each container sees its own MIG UUID.",
		},
		Plugin: localcluster.PluginConfig{Profile: "h100-80gb", Args: []string{"--mock-mig=all"}},
	},
	{
		// The controller's scenario (queues and a gang); runs when
		// demo/queues has YAML files.
		Name:  "queues",
		Title: "two queues sharing a node, and a gang of 4 that starts together",
		Story: []string{
			"Needs Tessera's controller (its webhook gates pods labelled tessera.dev/queue, it admits them by queue",
			"quota) and the kubelet plugin at --mock-profile=t4:2: one node, two T4s of 15104Mi each (29.5Gi in all).",
			"Two teams' queues share the node, a gang of 4 waits and then starts together, a reclaim evicts the",
			"over-quota gang for a pod within its quota, and a limit keeps a pod gated. Steps: demo/queues/README.md.",
		},
		Plugin:     localcluster.PluginConfig{Profile: "t4:2"},
		Controller: true,
		Optional:   true,
	},
	{
		Name:  "gang-job",
		Title: "an indexed Job of 4 workers as one gang",
		Story: []string{
			"Two indexed Jobs of 4 workers each, every Job one gang (tessera.dev/gang in its pod template).",
			"4 x 8Gi: one 8Gi share fits per T4, so 2 of 4 workers fit and none starts. 4 x 6Gi: two fit per T4,",
			"and the four workers start together. Without the gang, the first Job would start two workers that",
			"wait forever for the other two.",
		},
		Plugin:     localcluster.PluginConfig{Profile: "t4:2"},
		Controller: true,
	},
}

// Find returns the scenario of that name.
func Find(name string) (Scenario, bool) {
	for _, s := range Scenarios {
		if s.Name == name {
			return s, true
		}
	}
	return Scenario{}, false
}

// Dir is the scenario's directory in the repository.
func (s Scenario) Dir(repo string) string { return filepath.Join(repo, "demo", s.Name) }

// Files are the scenario's YAML files in the order they are applied.
func (s Scenario) Files(repo string) ([]string, error) {
	var out []string
	for _, pat := range []string{"*.yaml", "*.yml"} {
		m, err := filepath.Glob(filepath.Join(s.Dir(repo), pat))
		if err != nil {
			return nil, err
		}
		out = append(out, m...)
	}
	sort.Strings(out)
	return out, nil
}

// Present tells whether the scenario has YAML to apply.
func (s Scenario) Present(repo string) bool {
	f, err := s.Files(repo)
	return err == nil && len(f) > 0
}

// Kubectl runs the cluster's kubectl.
type Kubectl func(ctx context.Context, args ...string) (string, error)

// Env is what a run needs of the cluster.
type Env struct {
	Client   kubernetes.Interface
	Kubectl  Kubectl
	RepoRoot string
	// Out receives the narrative; nil discards it.
	Out io.Writer
	// StepTimeout bounds each step's wait (default 2 minutes).
	StepTimeout time.Duration
}

// Run is one scenario applied to one namespace.
type Run struct {
	*Env
	Scenario  Scenario
	Namespace string
	// ClaimUIDs are the claims seen in the namespace (for the unprepare
	// checks), by name.
	ClaimUIDs map[string]types.UID
	// Expect overrides a pod's demo.tessera.dev/expect annotation.
	Expect map[string]corev1.PodPhase
}

// NewRun returns a run of s in namespace ns (which must exist).
func NewRun(env *Env, s Scenario, ns string) *Run {
	return &Run{Env: env, Scenario: s, Namespace: ns, ClaimUIDs: map[string]types.UID{}, Expect: map[string]corev1.PodPhase{}}
}

// printf writes to the narrative (Env.Out), if any.
func (r *Run) printf(format string, args ...any) {
	if r.Out != nil {
		fmt.Fprintf(r.Out, format, args...)
	}
}
