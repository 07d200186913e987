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
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

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

func (r *Run) printf(format string, args ...any) {
	if r.Out != nil {
		fmt.Fprintf(r.Out, format, args...)
	}
}

// Manifest is what a YAML document names.
type Manifest struct {
	Kind        string
	Name        string
	Annotations map[string]string
	// Parallelism is a Job's spec.parallelism (the pods it starts).
	Parallelism int
}

// ReadManifests lists the objects of a multi-document YAML file.
func ReadManifests(path string) ([]Manifest, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Manifest
	for _, doc := range splitYAML(string(b)) {
		var m struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name        string            `json:"name"`
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
			Spec struct {
				Parallelism *int `json:"parallelism"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if m.Kind == "" {
			continue
		}
		mf := Manifest{Kind: m.Kind, Name: m.Metadata.Name, Annotations: m.Metadata.Annotations}
		if m.Kind == "Job" {
			mf.Parallelism = 1
			if m.Spec.Parallelism != nil {
				mf.Parallelism = *m.Spec.Parallelism
			}
		}
		out = append(out, mf)
	}
	return out, nil
}

func splitYAML(s string) []string {
	var docs []string
	var cur strings.Builder
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.TrimRight(l, " ") == "---" {
			docs = append(docs, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteString(l + "\n")
	}
	return append(docs, cur.String())
}

// Apply applies every file of the scenario in order, waiting after each
// for the pods to reach their expectations.
func (r *Run) Apply(ctx context.Context) error {
	files, err := r.Scenario.Files(r.RepoRoot)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("demo/%s has no YAML files", r.Scenario.Name)
	}
	for _, f := range files {
		if err := r.ApplyFile(ctx, f); err != nil {
			return err
		}
	}
	return nil
}

// ApplyFile applies one file with kubectl and waits until the pods of the
// namespace reach their expectations.
func (r *Run) ApplyFile(ctx context.Context, path string) error {
	manifests, err := ReadManifests(path)
	if err != nil {
		return err
	}
	rel, _ := filepath.Rel(r.RepoRoot, path)
	r.printf("  $ kubectl apply -n %s -f %s\n", r.Namespace, rel)
	out, err := r.Kubectl(ctx, "apply", "-n", r.Namespace, "-f", path)
	if err != nil {
		return err
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		r.printf("    %s\n", l)
	}
	var named []string
	for _, m := range manifests {
		switch m.Kind {
		case "Pod":
			named = append(named, m.Name)
		case "Job":
			// The Job controller names its pods; wait for them to exist,
			// then hold them to their template's expectation.
			if err := r.waitJobPods(ctx, m.Name, m.Parallelism); err != nil {
				return err
			}
		}
	}
	return r.WaitPods(ctx, named)
}

// JobPods returns the pods of a Job, by the label the Job controller sets.
func (r *Run) JobPods(ctx context.Context, job string) ([]corev1.Pod, error) {
	pods, err := r.Client.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
	if err != nil {
		return nil, err
	}
	return pods.Items, nil
}

func (r *Run) waitJobPods(ctx context.Context, job string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		pods, err := r.JobPods(ctx, job)
		if err == nil && len(pods) >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("job %s: %d of %d pods created after a minute (%v)\n%s", job, len(pods), n, err, r.Events(context.Background(), ""))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Expectation of a pod: Run.Expect, else its annotation: Running (default),
// Succeeded or Pending.
func (r *Run) Expectation(p *corev1.Pod) corev1.PodPhase {
	if e, ok := r.Expect[p.Name]; ok {
		return e
	}
	switch strings.ToLower(p.Annotations[ExpectAnnotation]) {
	case "pending":
		return corev1.PodPending
	case "succeeded":
		return corev1.PodSucceeded
	}
	return corev1.PodRunning
}

// PendingReason is the scheduler's verdict on a pod it could not place
// (reason: message), or "" while it has none.
func PendingReason(p *corev1.Pod) string {
	if len(p.Spec.SchedulingGates) > 0 {
		var gates []string
		for _, g := range p.Spec.SchedulingGates {
			gates = append(gates, g.Name)
		}
		return "SchedulingGated: " + strings.Join(gates, ", ")
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason != "" {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

// met tells whether a pod reached its expectation; a pod that ended in a
// phase it was not expected to reach is an error.
func (r *Run) met(p *corev1.Pod) (bool, error) {
	want := r.Expectation(p)
	switch {
	case p.Status.Phase == want && want != corev1.PodPending:
		return true, nil
	case want == corev1.PodPending:
		if p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
			return false, fmt.Errorf("pod %s was expected to stay Pending but is %s on %q", p.Name, p.Status.Phase, p.Spec.NodeName)
		}
		return PendingReason(p) != "", nil
	case p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded:
		return false, fmt.Errorf("pod %s ended %s, want %s: %s", p.Name, p.Status.Phase, want, containerStates(p))
	}
	return false, nil
}

func containerStates(p *corev1.Pod) string {
	var parts []string
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Terminated != nil:
			parts = append(parts, fmt.Sprintf("%s terminated %s (exit %d) %s", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.ExitCode, cs.State.Terminated.Message))
		case cs.State.Waiting != nil:
			parts = append(parts, fmt.Sprintf("%s waiting %s %s", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message))
		}
	}
	return strings.Join(parts, "; ")
}

// WaitPods waits until the named pods exist and every pod of the namespace
// meets its expectation. A pod that is being deleted (evicted by the
// controller's reclaim, say) and is not named is no longer held to its
// expectation: it is leaving. On timeout the error says what each pod waits for,
// with the namespace's warning events.
func (r *Run) WaitPods(ctx context.Context, named []string) error {
	timeout := r.StepTimeout
	if timeout == 0 {
		timeout = 2 * time.Minute
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lastReport := start
	for {
		pods, err := r.Client.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{})
		if err == nil {
			done := true
			var waiting []string
			have := map[string]bool{}
			pods.Items = slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool {
				return p.DeletionTimestamp != nil && !slices.Contains(named, p.Name)
			})
			for i := range pods.Items {
				p := &pods.Items[i]
				have[p.Name] = true
				ok, err := r.met(p)
				if err != nil {
					return fmt.Errorf("%w\n%s", err, r.Events(context.Background(), p.Name))
				}
				if !ok {
					done = false
					waiting = append(waiting, fmt.Sprintf("%s (%s, want %s)", p.Name, p.Status.Phase, r.Expectation(p)))
				}
			}
			for _, n := range named {
				if !have[n] {
					done = false
					waiting = append(waiting, n+" (not created yet)")
				}
			}
			if done {
				var running, pending int
				for i := range pods.Items {
					if r.Expectation(&pods.Items[i]) == corev1.PodPending {
						pending++
					} else {
						running++
					}
				}
				msg := fmt.Sprintf("%d pod(s) as expected", len(pods.Items))
				if pending > 0 {
					msg = fmt.Sprintf("%d pod(s) started, %d Pending as expected", running, pending)
				}
				r.printf("    %s (%.1fs)\n", msg, time.Since(start).Seconds())
				return nil
			}
			if time.Since(lastReport) > 15*time.Second {
				r.printf("    still waiting for %s (%s)\n", strings.Join(waiting, ", "), time.Since(start).Round(time.Second))
				if ev := r.Events(ctx, ""); ev != "" {
					r.printf("    warnings so far:\n%s", indent(lastLines(ev, 5), "    "))
				}
				lastReport = time.Now()
			}
			if ctx.Err() != nil {
				return fmt.Errorf("after %s still waiting for %s\n%s", timeout, strings.Join(waiting, ", "), r.Events(context.Background(), ""))
			}
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("listing pods: %w", err)
			}
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Events returns the namespace's warning events (of one object when name
// is set), one a line, for error messages.
func (r *Run) Events(ctx context.Context, name string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	evs, err := r.Client.CoreV1().Events(r.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "(events: " + err.Error() + ")"
	}
	when := func(e corev1.Event) time.Time {
		switch {
		case !e.LastTimestamp.IsZero():
			return e.LastTimestamp.Time
		case !e.EventTime.IsZero():
			return e.EventTime.Time
		}
		return e.CreationTimestamp.Time
	}
	sort.SliceStable(evs.Items, func(i, j int) bool { return when(evs.Items[i]).Before(when(evs.Items[j])) })
	var sb strings.Builder
	for _, e := range evs.Items {
		if e.Type != corev1.EventTypeWarning || (name != "" && e.InvolvedObject.Name != name) {
			continue
		}
		fmt.Fprintf(&sb, "  event %s/%s %s: %s\n", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
	}
	return sb.String()
}

// Device is one allocated device of a claim, with what the ResourceSlice
// says of it.
type Device struct {
	Request string
	Pool    string
	Name    string
	ShareID string
	// Memory is what the claim got of the device's memory: its
	// consumedCapacity for a share, else the device's whole memory.
	Memory *resource.Quantity
	// Cores is the consumed compute percent of a share (nil if none).
	Cores *resource.Quantity
	// Capacity is the device's published memory.
	Capacity *resource.Quantity
	// Attributes of the device (uuid, type, index, productName,
	// migProfile, parentUUID, ...), as strings.
	Attributes map[string]string
	// Data is the driver's status.devices[].data for this device.
	Data map[string]any
}

// Type is the device's type attribute (gpu, timeslice, mig).
func (d Device) Type() string { return d.Attributes["type"] }

// GPU is the UUID of the physical GPU the device is part of.
func (d Device) GPU() string {
	if p := d.Attributes["parentUUID"]; p != "" {
		return p
	}
	return d.Attributes["uuid"]
}

// Claim is one ResourceClaim of a pod.
type Claim struct {
	PodClaim string // the pod's name for it
	Name     string
	UID      types.UID
	Devices  []Device
}

// Placement is where a pod landed and what its container sees.
type Placement struct {
	Pod    *corev1.Pod
	Claims []Claim
	// Log is the container's log; Env the variables it printed
	// (NAME=value lines).
	Log string
	Env map[string]string
}

// Placements reports every pod of the namespace, sorted by name. For
// running or finished pods it waits (briefly) for the container's log.
func (r *Run) Placements(ctx context.Context) ([]Placement, error) {
	pods, err := r.Client.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	slicesList, err := r.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	devs := indexDevices(slicesList.Items)
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	var out []Placement
	for i := range pods.Items {
		p := &pods.Items[i]
		pl := Placement{Pod: p}
		for _, st := range p.Status.ResourceClaimStatuses {
			if st.ResourceClaimName == nil {
				continue
			}
			c, err := r.Client.ResourceV1().ResourceClaims(r.Namespace).Get(ctx, *st.ResourceClaimName, metav1.GetOptions{})
			if apierrors.IsNotFound(err) && (p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) {
				continue // the pod ended or is leaving: the claim made for it is gone
			}
			if err != nil {
				return nil, err
			}
			r.ClaimUIDs[c.Name] = c.UID
			pl.Claims = append(pl.Claims, Claim{PodClaim: st.Name, Name: c.Name, UID: c.UID, Devices: claimDevices(c, devs)})
		}
		if p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded {
			pl.Log = r.waitLog(ctx, p.Name)
			pl.Env = ParseEnv(pl.Log)
		}
		out = append(out, pl)
	}
	return out, nil
}

// waitLog returns the pod's log once it has a line that looks like a
// variable (or after 15 s).
func (r *Run) waitLog(ctx context.Context, pod string) string {
	deadline := time.Now().Add(15 * time.Second)
	var log string
	for {
		b, err := r.Client.CoreV1().Pods(r.Namespace).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err == nil {
			log = string(b)
			if strings.Contains(log, "=") {
				return log
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return log
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// ParseEnv reads NAME=value lines.
func ParseEnv(log string) map[string]string {
	env := map[string]string{}
	for _, l := range strings.Split(log, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), "=")
		if ok && k != "" && !strings.ContainsAny(k, " \t") {
			env[k] = v
		}
	}
	return env
}

type sliceDevice struct {
	dev resourceapi.Device
}

func indexDevices(slices []resourceapi.ResourceSlice) map[string]sliceDevice {
	// Only the newest generation of each pool counts.
	newest := map[string]int64{}
	for _, s := range slices {
		if s.Spec.Driver == Driver && s.Spec.Pool.Generation > newest[s.Spec.Pool.Name] {
			newest[s.Spec.Pool.Name] = s.Spec.Pool.Generation
		}
	}
	out := map[string]sliceDevice{}
	for _, s := range slices {
		if s.Spec.Driver != Driver || s.Spec.Pool.Generation != newest[s.Spec.Pool.Name] {
			continue
		}
		for _, d := range s.Spec.Devices {
			out[s.Spec.Pool.Name+"/"+d.Name] = sliceDevice{dev: d}
		}
	}
	return out
}

func attributeString(a resourceapi.DeviceAttribute) string {
	switch {
	case a.StringValue != nil:
		return *a.StringValue
	case a.IntValue != nil:
		return fmt.Sprint(*a.IntValue)
	case a.BoolValue != nil:
		return fmt.Sprint(*a.BoolValue)
	case a.VersionValue != nil:
		return *a.VersionValue
	}
	return ""
}

func claimDevices(c *resourceapi.ResourceClaim, devs map[string]sliceDevice) []Device {
	if c.Status.Allocation == nil {
		return nil
	}
	var out []Device
	for _, res := range c.Status.Allocation.Devices.Results {
		if res.Driver != Driver {
			continue
		}
		d := Device{Request: res.Request, Pool: res.Pool, Name: res.Device, Attributes: map[string]string{}}
		if res.ShareID != nil {
			d.ShareID = string(*res.ShareID)
		}
		if sd, ok := devs[res.Pool+"/"+res.Device]; ok {
			for k, a := range sd.dev.Attributes {
				name := string(k)
				if i := strings.LastIndexByte(name, '/'); i >= 0 && strings.HasPrefix(name, Driver+"/") {
					name = name[i+1:]
				}
				d.Attributes[name] = attributeString(a)
			}
			if cp, ok := sd.dev.Capacity["memory"]; ok {
				q := cp.Value.DeepCopy()
				d.Capacity = &q
			}
		}
		if q, ok := res.ConsumedCapacity["memory"]; ok {
			q := q.DeepCopy()
			d.Memory = &q
		} else if d.Capacity != nil {
			q := d.Capacity.DeepCopy()
			d.Memory = &q
		}
		if q, ok := res.ConsumedCapacity["cores"]; ok && !q.IsZero() {
			q := q.DeepCopy()
			d.Cores = &q
		}
		for _, st := range c.Status.Devices {
			if st.Driver != res.Driver || st.Pool != res.Pool || st.Device != res.Device {
				continue
			}
			if st.ShareID != nil && res.ShareID != nil && *st.ShareID != string(*res.ShareID) {
				continue
			}
			if st.Data != nil && len(st.Data.Raw) > 0 {
				_ = json.Unmarshal(st.Data.Raw, &d.Data)
			}
		}
		out = append(out, d)
	}
	return out
}

// ClaimFiles lists the files and directories on this node that belong to a
// claim: the plugin's CDI spec in localcluster.CDIRoot and anything under
// the plugin data directory (checkpoint, accounting directory) whose path
// names the claim's UID.
func ClaimFiles(uid types.UID) []string {
	var out []string
	for _, root := range []string{localcluster.CDIRoot, PluginDataDir} {
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if strings.Contains(d.Name(), string(uid)) {
				out = append(out, p)
				if d.IsDir() {
					return filepath.SkipDir
				}
			}
			return nil
		})
	}
	return out
}

// PluginDataDir is the kubelet plugin's data directory in the local cluster.
var PluginDataDir = filepath.Join(localcluster.KubeletRootDir, "plugins", Driver)

// Cleanup deletes the namespace's pods and waits until they are gone and
// every claim the run saw is unprepared: its ResourceClaim deleted (claims
// made from templates go with their pod) or deallocated, and no file of it
// left (ClaimFiles). It reports what it checked.
func (r *Run) Cleanup(ctx context.Context, timeout time.Duration) error {
	// Claims the run has not looked at yet count too.
	if claims, err := r.Client.ResourceV1().ResourceClaims(r.Namespace).List(ctx, metav1.ListOptions{}); err == nil {
		for _, c := range claims.Items {
			r.ClaimUIDs[c.Name] = c.UID
		}
	}
	pods, err := r.Client.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	start := time.Now()
	r.printf("  deleting %d pod(s) in %s\n", len(pods.Items), r.Namespace)
	grace := int64(1)
	for _, p := range pods.Items {
		if err := r.Client.CoreV1().Pods(r.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var left []string
	for {
		left = left[:0]
		pods, err := r.Client.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, p := range pods.Items {
				left = append(left, "pod "+p.Name)
			}
		}
		claims, err := r.Client.ResourceV1().ResourceClaims(r.Namespace).List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, c := range claims.Items {
				if c.Status.Allocation != nil || len(c.Status.ReservedFor) > 0 {
					left = append(left, "claim "+c.Name+" (allocated)")
				}
			}
		}
		names := make([]string, 0, len(r.ClaimUIDs))
		for n := range r.ClaimUIDs {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			for _, f := range ClaimFiles(r.ClaimUIDs[n]) {
				left = append(left, "file "+f)
			}
		}
		if len(left) == 0 {
			r.printf("    pods gone, %d claim(s) unprepared: no CDI spec or plugin file of theirs left on the node (%.1fs)\n",
				len(r.ClaimUIDs), time.Since(start).Seconds())
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s still left: %s", timeout, strings.Join(left, ", "))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + "\n"
}

func indent(s, prefix string) string {
	var sb strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		sb.WriteString(prefix + l + "\n")
	}
	return sb.String()
}
