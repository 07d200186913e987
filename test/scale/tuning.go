package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/test/localcluster"
)

// SchedulerTuning is the kube-scheduler configuration of one setting of the
// tuning run (make bench-tuning), written as a KubeSchedulerConfiguration.
type SchedulerTuning struct {
	// PercentageOfNodesToScore is the share of feasible nodes the scheduler
	// looks for before it scores; 0 for its adaptive default (50% minus
	// the number of nodes / 125, at least 5%; 46% at 500 nodes).
	PercentageOfNodesToScore int32
	// QPS and Burst are its client's rate limits.
	QPS   float32
	Burst int32
	// FeatureGates are set on top of the cluster's own.
	FeatureGates map[string]bool
}

// LiftedScheduler is the scale run's scheduler: client limits lifted as by
// ClusterOptions, everything else its default.
func LiftedScheduler() SchedulerTuning { return SchedulerTuning{QPS: 5000, Burst: 10000} }

// Setting is one configuration the tuning run measures against the
// default in the same run.
type Setting struct {
	// Name is short and goes into namespace names.
	Name string
	// Knob names what is changed; Value its value in this setting.
	Knob, Value string
	// Scheduler is kube-scheduler's configuration.
	Scheduler SchedulerTuning
	// Controller are flags set on Tessera's controller (nil: the chart's).
	Controller map[string]string
	// Workloads are the workloads measured, by name: "claims" (a', share
	// claims without queues: what the scheduler alone does) and "shares"
	// (a, the same in Tessera's queues).
	Workloads []string
	// Baseline marks a measurement of the defaults: the run measures them
	// several times, and a setting's effect is judged against their spread.
	Baseline bool
}

// Settings are the tuning run's settings in order: the defaults first, in
// the middle and last (how far the same setting moves within one run, the
// cold start after the cluster came up included), and between them each
// change of one knob.
func Settings() []Setting {
	both := []string{"claims", "shares"}
	queued := []string{"shares"}
	sched := func(change func(*SchedulerTuning)) SchedulerTuning {
		s := LiftedScheduler()
		change(&s)
		return s
	}
	defaults := func(name, when string) Setting {
		return Setting{Name: name, Knob: "defaults (kube-scheduler's client limits lifted, Tessera's chart), " + when, Value: "-",
			Scheduler: LiftedScheduler(), Workloads: both, Baseline: true}
	}
	return []Setting{
		defaults("default", "first"),
		{Name: "score100", Knob: "kube-scheduler `percentageOfNodesToScore`", Value: "100 (default: adaptive, 46% at 500 nodes)",
			Scheduler: sched(func(s *SchedulerTuning) { s.PercentageOfNodesToScore = 100 }), Workloads: both},
		{Name: "score10", Knob: "kube-scheduler `percentageOfNodesToScore`", Value: "10",
			Scheduler: sched(func(s *SchedulerTuning) { s.PercentageOfNodesToScore = 10 }), Workloads: both},
		{Name: "schedqps50", Knob: "kube-scheduler client QPS / burst", Value: "50 / 100, its defaults (the run's: 5000 / 10000)",
			Scheduler: sched(func(s *SchedulerTuning) { s.QPS, s.Burst = 50, 100 }), Workloads: both},
		defaults("default-mid", "in the middle"),
		{Name: "prequeueing", Knob: "kube-scheduler gate `SchedulerPreQueueingHints` (alpha, off by default)", Value: "on",
			Scheduler: sched(func(s *SchedulerTuning) { s.FeatureGates = map[string]bool{"SchedulerPreQueueingHints": true} }), Workloads: both},
		{Name: "workers4", Knob: "Tessera `--apply-workers`", Value: "4 (default 16)", Scheduler: LiftedScheduler(),
			Controller: map[string]string{"--apply-workers": "4"}, Workloads: queued},
		{Name: "ctlqps50", Knob: "Tessera `--kube-api-qps` / `--kube-api-burst`", Value: "50 / 100 (default 200 / 400)", Scheduler: LiftedScheduler(),
			Controller: map[string]string{"--kube-api-qps": "50", "--kube-api-burst": "100"}, Workloads: queued},
		{Name: "cycle2s", Knob: "Tessera `--cycle-interval`", Value: "2s (default 500ms)", Scheduler: LiftedScheduler(),
			Controller: map[string]string{"--cycle-interval": "2s"}, Workloads: queued},
		defaults("default-again", "last"),
	}
}

// schedulerConfig is the KubeSchedulerConfiguration of t for a scheduler
// whose identity's kubeconfig is kubeconfig (with --config, kube-scheduler
// ignores --kubeconfig and --kube-api-qps). Leader election stays with the
// command line (--leader-elect=false), which --config leaves in force.
func schedulerConfig(kubeconfig string, t SchedulerTuning) ([]byte, error) {
	if t.QPS <= 0 || t.Burst <= 0 {
		return nil, fmt.Errorf("scheduler tuning: QPS (%v) and Burst (%d) must be positive", t.QPS, t.Burst)
	}
	if t.PercentageOfNodesToScore < 0 || t.PercentageOfNodesToScore > 100 {
		return nil, fmt.Errorf("scheduler tuning: PercentageOfNodesToScore %d must be 0 (adaptive) to 100", t.PercentageOfNodesToScore)
	}
	type clientConnection struct {
		Kubeconfig string  `json:"kubeconfig"`
		QPS        float32 `json:"qps"`
		Burst      int32   `json:"burst"`
	}
	cfg := struct {
		APIVersion               string           `json:"apiVersion"`
		Kind                     string           `json:"kind"`
		ClientConnection         clientConnection `json:"clientConnection"`
		PercentageOfNodesToScore *int32           `json:"percentageOfNodesToScore,omitempty"`
	}{
		APIVersion:       "kubescheduler.config.k8s.io/v1",
		Kind:             "KubeSchedulerConfiguration",
		ClientConnection: clientConnection{Kubeconfig: kubeconfig, QPS: t.QPS, Burst: t.Burst},
	}
	if t.PercentageOfNodesToScore > 0 {
		cfg.PercentageOfNodesToScore = &t.PercentageOfNodesToScore
	}
	return yaml.Marshal(cfg)
}

// schedulerArgs are the arguments that run kube-scheduler with the
// configuration file config and t's feature gates (sorted).
func schedulerArgs(config string, t SchedulerTuning) []string {
	args := []string{"--config=" + config}
	if len(t.FeatureGates) > 0 {
		var gates []string
		for name, on := range t.FeatureGates {
			gates = append(gates, name+"="+strconv.FormatBool(on))
		}
		slices.Sort(gates)
		args = append(args, "--feature-gates="+strings.Join(gates, ","))
	}
	return args
}

// SettingCommand is how a cluster owner sets s: the scheduler's
// configuration and gates, the controller's flags.
func SettingCommand(s Setting) string {
	var parts []string
	def := LiftedScheduler()
	if t := s.Scheduler; t.PercentageOfNodesToScore != def.PercentageOfNodesToScore {
		parts = append(parts, fmt.Sprintf("KubeSchedulerConfiguration `percentageOfNodesToScore: %d`", t.PercentageOfNodesToScore))
	}
	if t := s.Scheduler; t.QPS != def.QPS || t.Burst != def.Burst {
		parts = append(parts, fmt.Sprintf("KubeSchedulerConfiguration `clientConnection: {qps: %g, burst: %d}`", t.QPS, t.Burst))
	}
	if len(s.Scheduler.FeatureGates) > 0 {
		parts = append(parts, "kube-scheduler `"+schedulerArgs("", s.Scheduler)[1]+"`")
	}
	if len(s.Controller) > 0 {
		parts = append(parts, "controller `"+describeFlags(s.Controller)+"`")
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "; ")
}

// TuningName is the name of the result of workload in setting.
func TuningName(setting, workload string) string { return setting + "-" + workload }

// TuningConfig sizes the tuning run: full is 500 nodes and 1,000 share pods
// per workload; small the smoke variant.
func TuningConfig(small bool) Config {
	cfg := Default()
	cfg.Pods, cfg.Timeout = 1000, 5*time.Minute
	if small {
		cfg = Small()
		cfg.Pods = 100
	}
	return cfg
}

// RunTuning brings the scale run's cluster up (cfg's nodes and queues),
// warms it up with one unreported workload and measures, for each setting
// in turn, its workloads with kube-scheduler restarted with the setting's
// configuration and Tessera's controller with its flags. Each result is named TuningName(setting, workload). As Run, it
// returns what was measured when a setting fails (Report.Failed).
func RunTuning(ctx context.Context, cfg Config, settings []Setting, logf localcluster.Logf) (*Report, error) {
	byName := map[string]workload{}
	for _, w := range workloads(cfg) {
		byName[w.name] = w
	}
	for _, s := range settings {
		for _, name := range s.Workloads {
			if _, ok := byName[name]; !ok {
				return nil, fmt.Errorf("setting %s: no workload %q (claims or shares)", s.Name, name)
			}
		}
	}
	dir, err := os.MkdirTemp("", "tessera-tuning-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	return onCluster(ctx, cfg, logf, func(ctx context.Context, h *harness, cl *localcluster.Cluster, rep *Report) error {
		// In the first full run the first pods after the cluster came up
		// took 1.45x as long as the same defaults last: one unreported
		// workload warms the cluster up. In the next run the first defaults
		// were still the slowest of three, so it is their three
		// measurements, not the warm-up, that keep this out of verdicts.
		warm := byName["claims"]
		warm.name, warm.title = "warmup", "warm-up, not reported: "+warm.title
		if _, err := h.measure(ctx, warm); err != nil {
			rep.Failed = fmt.Sprintf("%s: %v", warm.title, err)
			return err
		}
		for _, s := range settings {
			if err := h.restartScheduler(ctx, cl, filepath.Join(dir, s.Name+".yaml"), s.Scheduler); err != nil {
				rep.Failed = fmt.Sprintf("setting %s: %v", s.Name, err)
				return err
			}
			for _, name := range s.Workloads {
				w := byName[name]
				w.name, w.flags, w.profile = TuningName(s.Name, name), s.Controller, false
				w.title = fmt.Sprintf("%s, %s: %s", s.Name, name, w.title)
				run, err := h.measure(ctx, w)
				if err != nil {
					rep.Failed = fmt.Sprintf("%s: %v", w.title, err)
					return err
				}
				rep.Runs = append(rep.Runs, run)
			}
		}
		return nil
	})
}

// restartScheduler writes t's configuration to path and restarts
// kube-scheduler with it.
func (h *harness) restartScheduler(ctx context.Context, cl *localcluster.Cluster, path string, t SchedulerTuning) error {
	data, err := schedulerConfig(cl.SchedulerKubeconfig(), t)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return err
	}
	args := schedulerArgs(path, t)
	h.logf("kube-scheduler: restarting with %s (%s)", strings.Join(args, " "), strings.Join(strings.Fields(string(data)), " "))
	start := time.Now()
	if err := cl.RestartScheduler(ctx, args); err != nil {
		return err
	}
	h.logf("kube-scheduler: ready in %s", time.Since(start).Round(100*time.Millisecond))
	return nil
}
