package scale

import (
	"os"
	"reflect"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/test/testutil"
)

// TestClusterOptionsProbeTheChartsDefault: the scale cluster sets the
// plugin's probe values back from the local-cluster ones (every 2 s) to
// the chart's own defaults; they must stay the chart's defaults.
func TestClusterOptionsProbeTheChartsDefault(t *testing.T) {
	data, err := os.ReadFile(testutil.Path(t, "deployments", "helm", "tessera", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		KubeletPlugin struct {
			Healthcheck map[string]any `json:"healthcheck"`
		} `json:"kubeletPlugin"`
	}
	if err := yaml.Unmarshal(data, &chart); err != nil {
		t.Fatal(err)
	}
	ours := ClusterOptions(nil).ChartValues["kubeletPlugin"].(map[string]any)["healthcheck"].(map[string]any)
	for k, v := range ours {
		want, ok := chart.KubeletPlugin.Healthcheck[k]
		// JSON numbers decode as float64; ours are ints.
		if n, isInt := v.(int); isInt {
			v = float64(n)
		}
		if !ok || !reflect.DeepEqual(v, want) {
			t.Errorf("kubeletPlugin.healthcheck.%s = %v in ClusterOptions, the chart's default is %v", k, v, want)
		}
	}
}
