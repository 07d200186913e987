package scale

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

func TestSchedulerConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tuning  SchedulerTuning
		want    map[string]any
		wantErr string
	}{
		{"lifted, adaptive score", LiftedScheduler(), map[string]any{
			"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
			"clientConnection": map[string]any{"kubeconfig": "/k", "qps": float64(5000), "burst": float64(10000)},
		}, ""},
		{"score 10, default client", SchedulerTuning{PercentageOfNodesToScore: 10, QPS: 50, Burst: 100}, map[string]any{
			"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
			"clientConnection":         map[string]any{"kubeconfig": "/k", "qps": float64(50), "burst": float64(100)},
			"percentageOfNodesToScore": float64(10),
		}, ""},
		{"no QPS", SchedulerTuning{Burst: 1}, nil, "QPS"},
		{"score over 100", SchedulerTuning{PercentageOfNodesToScore: 101, QPS: 1, Burst: 1}, nil, "PercentageOfNodesToScore"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := schedulerConfig("/k", tc.tuning)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := yaml.UnmarshalStrict(data, &got); err != nil {
				t.Fatalf("%v\n%s", err, data)
			}
			if !equalJSON(got, tc.want) {
				t.Errorf("config =\n%s\nwant %v", data, tc.want)
			}
		})
	}
}

func equalJSON(a, b map[string]any) bool {
	x, err1 := yaml.Marshal(a)
	y, err2 := yaml.Marshal(b)
	return err1 == nil && err2 == nil && string(x) == string(y)
}

func TestSchedulerArgsAndCommand(t *testing.T) {
	for _, tc := range []struct {
		name    string
		setting Setting
		args    []string
		command string
	}{
		{"default", Setting{Scheduler: LiftedScheduler()}, []string{"--config=/c"}, "-"},
		{"gates sorted", Setting{Scheduler: SchedulerTuning{QPS: 5000, Burst: 10000, FeatureGates: map[string]bool{"Z": false, "SchedulerPreQueueingHints": true}}},
			[]string{"--config=/c", "--feature-gates=SchedulerPreQueueingHints=true,Z=false"},
			"kube-scheduler `--feature-gates=SchedulerPreQueueingHints=true,Z=false`"},
		{"score and client", Setting{Scheduler: SchedulerTuning{PercentageOfNodesToScore: 100, QPS: 50, Burst: 100}},
			[]string{"--config=/c"},
			"KubeSchedulerConfiguration `percentageOfNodesToScore: 100`; KubeSchedulerConfiguration `clientConnection: {qps: 50, burst: 100}`"},
		{"controller flags", Setting{Scheduler: LiftedScheduler(), Controller: map[string]string{"--kube-api-qps": "50", "--kube-api-burst": "100"}},
			[]string{"--config=/c"}, "controller `--kube-api-burst=100 --kube-api-qps=50`"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := schedulerArgs("/c", tc.setting.Scheduler); !slices.Equal(got, tc.args) {
				t.Errorf("schedulerArgs = %v, want %v", got, tc.args)
			}
			if got := SettingCommand(tc.setting); got != tc.command {
				t.Errorf("SettingCommand = %q, want %q", got, tc.command)
			}
		})
	}
}

// TestSettings: the defaults come first, in the middle and last and change
// nothing, every other setting changes something, names make valid
// namespaces, and every setting's scheduler configuration is valid.
func TestSettings(t *testing.T) {
	settings := Settings()
	var baselines []int
	for i, s := range settings {
		if s.Baseline {
			baselines = append(baselines, i)
		}
	}
	if n := len(settings) - 1; len(baselines) != 3 || baselines[0] != 0 || baselines[2] != n || baselines[1] < n/2-1 || baselines[1] > n/2+1 {
		t.Errorf("the defaults must be measured first, in the middle and last: at %v of %d settings", baselines, len(settings))
	}
	known := map[string]bool{}
	for _, w := range workloads(TuningConfig(true)) {
		known[w.name] = true
	}
	seen := map[string]bool{}
	for _, s := range settings {
		if seen[s.Name] {
			t.Errorf("setting %s twice", s.Name)
		}
		seen[s.Name] = true
		if changes := SettingCommand(s) != "-"; changes == s.Baseline {
			t.Errorf("setting %s: baseline %v, changes %q", s.Name, s.Baseline, SettingCommand(s))
		}
		if s.Baseline && !slices.Equal(s.Workloads, []string{"claims", "shares"}) {
			t.Errorf("baseline %s must measure both workloads, measures %v", s.Name, s.Workloads)
		}
		if len(s.Workloads) == 0 {
			t.Errorf("setting %s measures nothing", s.Name)
		}
		for _, w := range s.Workloads {
			if !known[w] {
				t.Errorf("setting %s: unknown workload %q", s.Name, w)
			}
			if errs := validation.IsDNS1123Label("scale-" + TuningName(s.Name, w)); len(errs) > 0 {
				t.Errorf("setting %s: namespace: %v", s.Name, errs)
			}
		}
		if _, err := schedulerConfig("/k", s.Scheduler); err != nil {
			t.Errorf("setting %s: %v", s.Name, err)
		}
	}
}

func TestTuningConfigFits(t *testing.T) {
	for _, small := range []bool{false, true} {
		if err := TuningConfig(small).Validate(8); err != nil {
			t.Errorf("TuningConfig(small=%v): %v", small, err)
		}
	}
}
