package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		wantOK   bool
		wantCode int
		wantOut  []string
	}{
		{name: "good flags", args: []string{"--port=3", "-v=2"}, wantOK: true},
		{name: "json logs and a logging gate", args: []string{"--port=3", "--logging-format=json", "--feature-gates=ContextualLogging=true"}, wantOK: true},
		{name: "help", args: []string{"--help"}, wantCode: 0, wantOut: []string{"Usage: demo [flags]", "Does a demo.", "--port", "--logging-format", "--feature-gates"}},
		{name: "unknown flag", args: []string{"--healthcheck"}, wantCode: 2, wantOut: []string{"demo: unknown flag: --healthcheck", "Usage: demo [flags]", "--port"}},
		{name: "bad value", args: []string{"--port=x"}, wantCode: 2, wantOut: []string{`invalid argument "x" for "--port"`, "Usage: demo"}},
		{name: "unknown log format", args: []string{"--logging-format=yaml"}, wantCode: 2, wantOut: []string{`format: Invalid value: "yaml"`, "Usage: demo"}},
		{name: "unknown gate", args: []string{"--feature-gates=Nope=true"}, wantCode: 2, wantOut: []string{"unrecognized feature gate: Nope", "Usage: demo"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { _ = logsapi.ResetForTest(nil) })
			fs := pflag.NewFlagSet("demo", pflag.ContinueOnError)
			port := fs.Int("port", 1, "a port")
			var out bytes.Buffer
			code, ok := Parse(fs, nil, "Does a demo.", tc.args, &out)
			if ok != tc.wantOK || code != tc.wantCode {
				t.Fatalf("Parse(%v) = %d, %v; want %d, %v\n%s", tc.args, code, ok, tc.wantCode, tc.wantOK, out.String())
			}
			if tc.wantOK && (*port != 3 || out.Len() != 0) {
				t.Errorf("port %d, output %q", *port, out.String())
			}
			for _, w := range tc.wantOut {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}
