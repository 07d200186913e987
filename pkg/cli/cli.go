// Package cli parses the commands' flags the same way in every binary:
// the command's own flags plus klog's, --help to standard error with exit
// 0, and a bad flag reported with its error and the usage, exit 2.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// Parse adds klog's flags to fs, sets the usage text (summary is printed
// between the "Usage:" line and the flag list) and parses args. It returns
// ok=false with the exit code when the command must stop: 0 after --help,
// 2 after a bad flag, whose error and the usage were written to out.
func Parse(fs *pflag.FlagSet, summary string, args []string, out io.Writer) (code int, ok bool) {
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: %s [flags]\n\n%s\n\nFlags:\n%s", fs.Name(), summary, fs.FlagUsages())
	}
	err := fs.Parse(args)
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, pflag.ErrHelp):
		return 0, false
	default:
		// With ContinueOnError pflag reports nothing itself.
		fmt.Fprintf(out, "%s: %v\n\n", fs.Name(), err)
		fs.Usage()
		return 2, false
	}
}
