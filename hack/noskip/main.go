// Command noskip reads `go test -json` on standard input, prints the run
// as `go test` would (every line with -stream, else each package's result
// and the output of failed tests), and fails when a test skipped that the
// allow-list does not name. A test that skips is a test that did not run:
// in `make test` it must either run or be listed with the reason it may
// not, and that list is printed at the end of every run.
//
//	go test -json ./... | go run ./hack/noskip --allow .ci/allowed-skips
//
// The allow-list has one entry a line, `<package> <TestName> <reason>`,
// where TestName may name a subtest (Parent/Child) and may end in `*` to
// take every test with that prefix; `#` starts a comment line.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

// entry is one line of the allow-list.
type entry struct {
	pkg, test, reason string
	used              bool
}

func (e *entry) matches(pkg, test string) bool {
	if e.pkg != pkg {
		return false
	}
	if prefix, ok := strings.CutSuffix(e.test, "*"); ok {
		return strings.HasPrefix(test, prefix)
	}
	return e.test == test
}

func parseAllow(r io.Reader) ([]*entry, error) {
	var out []*entry
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 {
			return nil, fmt.Errorf("line %d: %q: want `<package> <TestName> <reason>`", n, line)
		}
		out = append(out, &entry{pkg: f[0], test: f[1], reason: strings.Join(f[2:], " ")})
	}
	return out, sc.Err()
}

// skip is a test that skipped, with what it said.
type skip struct {
	pkg, test, why string
	allowedBy      *entry
}

// result is what a whole run showed.
type result struct {
	skips  []skip
	failed bool
}

// run copies the run to out as it goes and returns its skips.
func run(in io.Reader, out io.Writer, allow []*entry, stream bool) (result, error) {
	var res result
	// Output of each test (and each package), kept to print a failure's or
	// name a skip's reason.
	outputs := map[string][]string{}
	key := func(e event) string { return e.Package + " " + e.Test }
	dec := json.NewDecoder(in)
	for {
		var e event
		if err := dec.Decode(&e); err != nil {
			if errors.Is(err, io.EOF) {
				return res, nil
			}
			return res, fmt.Errorf("reading go test -json: %w", err)
		}
		switch e.Action {
		case "build-output":
			fmt.Fprint(out, e.Output)
		case "build-fail":
			res.failed = true
		case "output":
			if stream {
				fmt.Fprint(out, e.Output)
			}
			outputs[key(e)] = append(outputs[key(e)], e.Output)
		case "skip":
			if e.Test == "" { // a package without tests
				continue
			}
			s := skip{pkg: e.Package, test: e.Test, why: skipReason(outputs[key(e)])}
			for _, a := range allow {
				if a.matches(e.Package, e.Test) {
					s.allowedBy, a.used = a, true
					break
				}
			}
			res.skips = append(res.skips, s)
			delete(outputs, key(e))
		case "fail":
			res.failed = true
			if !stream {
				for _, line := range outputs[key(e)] {
					fmt.Fprint(out, line)
				}
				if e.Test == "" {
					fmt.Fprintf(out, "FAIL\t%s\t%.3fs\n", e.Package, e.Elapsed)
				}
			}
			delete(outputs, key(e))
		case "pass":
			if !stream && e.Test == "" {
				fmt.Fprintf(out, "ok  \t%s\t%.3fs\n", e.Package, e.Elapsed)
			}
			delete(outputs, key(e))
		}
	}
}

// skipReason is the message of t.Skip in a skipped test's output.
func skipReason(lines []string) string {
	var why []string
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- SKIP") {
			continue
		}
		why = append(why, l)
	}
	return strings.Join(why, " ")
}

// report prints the skips and says whether any was not allowed.
func report(out io.Writer, res result) bool {
	var allowed, refused []skip
	for _, s := range res.skips {
		if s.allowedBy != nil {
			allowed = append(allowed, s)
		} else {
			refused = append(refused, s)
		}
	}
	sort.Slice(allowed, func(i, j int) bool { return allowed[i].pkg+allowed[i].test < allowed[j].pkg+allowed[j].test })
	if len(allowed) > 0 {
		fmt.Fprintf(out, "\nnoskip: %d tests skipped, each allowed:\n", len(allowed))
		for _, s := range allowed {
			fmt.Fprintf(out, "  %s %s: %s (allowed: %s)\n", s.pkg, s.test, s.why, s.allowedBy.reason)
		}
	}
	if len(refused) == 0 {
		return true
	}
	fmt.Fprintf(out, "\nnoskip: %d tests skipped that the allow-list does not name; make them run (build what they need first) or add them with a reason:\n", len(refused))
	for _, s := range refused {
		fmt.Fprintf(out, "  %s %s: %s\n", s.pkg, s.test, s.why)
	}
	return false
}

func main() {
	allowPath := flag.String("allow", ".ci/allowed-skips", "the allow-list: `<package> <TestName> <reason>` a line")
	stream := flag.Bool("stream", false, "print every line of output as it comes (as go test -v does), not only failures")
	flag.Parse()
	f, err := os.Open(*allowPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "noskip:", err)
		os.Exit(2)
	}
	allow, err := parseAllow(f)
	f.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "noskip: %s: %v\n", *allowPath, err)
		os.Exit(2)
	}
	res, err := run(os.Stdin, os.Stdout, allow, *stream)
	if err != nil {
		fmt.Fprintln(os.Stderr, "noskip:", err)
		os.Exit(2)
	}
	ok := report(os.Stdout, res)
	if res.failed || !ok {
		os.Exit(1)
	}
}
