// Package cli parses the commands' flags the same way in every binary:
// the command's own flags, Kubernetes' logging flags (k8s.io/component-base:
// -v, --vmodule, --logging-format=text|json, ...) and --feature-gates for
// the logging gates and the binary's own (pkg/featuregates); --help to standard error with exit 0, and a bad flag
// or logging setting reported with its error and the usage, exit 2.
package cli

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
)

// Parse adds the logging flags and --feature-gates to fs, sets the usage
// text (summary is printed between the "Usage:" line and the flag list),
// parses args and applies the logging configuration: logs go to standard
// error (standard output is the commands' own, e.g. --print-slices). It
// returns ok=false with the exit code when the command must stop: 0 after
// --help, 2 after a bad flag, whose error and the usage were written to
// out. gates holds the binary's own gates (nil: none); --feature-gates
// sets them and the logging gates, which Parse adds to it.
func Parse(fs *pflag.FlagSet, gates featuregate.MutableVersionedFeatureGate, summary string, args []string, out io.Writer) (code int, ok bool) {
	if gates == nil {
		gates = featuregate.NewFeatureGate()
	}
	if err := logsapi.AddFeatureGates(gates); err != nil {
		panic(err) // the logging gates are known: a programming error
	}
	logging := logsapi.NewLoggingConfiguration()
	logsapi.AddFlags(logging, fs)
	gates.AddFlag(fs)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: %s [flags]\n\n%s\n\nFlags:\n%s", fs.Name(), summary, fs.FlagUsages())
	}
	err := fs.Parse(args)
	if errors.Is(err, pflag.ErrHelp) {
		return 0, false
	}
	if err == nil {
		err = logsapi.ValidateAndApplyWithOptions(logging, &logsapi.LoggingOptions{ErrorStream: os.Stderr, InfoStream: os.Stderr}, gates)
	}
	if err != nil {
		// With ContinueOnError pflag reports nothing itself.
		fmt.Fprintf(out, "%s: %v\n\n", fs.Name(), err)
		fs.Usage()
		return 2, false
	}
	return 0, true
}
