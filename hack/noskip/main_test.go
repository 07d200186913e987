package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	const allowList = `# comment
example.com/a TestNeedsGPU no GPU on CI machines
example.com/a TestRoot* needs root
`
	lines := func(ls ...string) string { return strings.Join(ls, "\n") + "\n" }
	tests := []struct {
		name       string
		in         string
		wantOK     bool
		wantFailed bool
		wantOut    []string
		wantNotOut []string
	}{
		{
			name: "an allowed skip, by name and by prefix",
			in: lines(
				`{"Action":"run","Package":"example.com/a","Test":"TestNeedsGPU"}`,
				`{"Action":"output","Package":"example.com/a","Test":"TestNeedsGPU","Output":"=== RUN   TestNeedsGPU\n"}`,
				`{"Action":"output","Package":"example.com/a","Test":"TestNeedsGPU","Output":"    x_test.go:9: no libcuda\n"}`,
				`{"Action":"output","Package":"example.com/a","Test":"TestNeedsGPU","Output":"--- SKIP: TestNeedsGPU (0.00s)\n"}`,
				`{"Action":"skip","Package":"example.com/a","Test":"TestNeedsGPU"}`,
				`{"Action":"skip","Package":"example.com/a","Test":"TestRootMounts/sub"}`,
				`{"Action":"pass","Package":"example.com/a","Elapsed":1.5}`,
				`{"Action":"skip","Package":"example.com/notests"}`,
			),
			wantOK:  true,
			wantOut: []string{"ok  \texample.com/a\t1.500s", "2 tests skipped, each allowed", "TestNeedsGPU: x_test.go:9: no libcuda (allowed: no GPU on CI machines)"},
		},
		{
			name: "a skip nobody allowed fails the run, named with its reason",
			in: lines(
				`{"Action":"output","Package":"example.com/b","Test":"TestSuite","Output":"    s_test.go:3: no kube-apiserver built\n"}`,
				`{"Action":"skip","Package":"example.com/b","Test":"TestSuite"}`,
				`{"Action":"pass","Package":"example.com/b","Elapsed":0.1}`,
			),
			wantOK:  false,
			wantOut: []string{"1 tests skipped that the allow-list does not name", "example.com/b TestSuite: s_test.go:3: no kube-apiserver built"},
		},
		{
			name:   "the same test name in another package is not allowed",
			in:     lines(`{"Action":"skip","Package":"example.com/c","Test":"TestNeedsGPU"}`),
			wantOK: false,
		},
		{
			name: "a failure prints the failed test's output only",
			in: lines(
				`{"Action":"output","Package":"example.com/a","Test":"TestGood","Output":"chatter of a passing test\n"}`,
				`{"Action":"pass","Package":"example.com/a","Test":"TestGood"}`,
				`{"Action":"output","Package":"example.com/a","Test":"TestBad","Output":"    bad_test.go:7: got 1, want 2\n"}`,
				`{"Action":"fail","Package":"example.com/a","Test":"TestBad"}`,
				`{"Action":"fail","Package":"example.com/a","Elapsed":2}`,
			),
			wantOK: true, wantFailed: true,
			wantOut:    []string{"bad_test.go:7: got 1, want 2", "FAIL\texample.com/a\t2.000s"},
			wantNotOut: []string{"chatter of a passing test"},
		},
		{
			name: "a build failure fails the run",
			in: lines(
				`{"ImportPath":"example.com/d","Action":"build-output","Output":"d.go:1: syntax error\n"}`,
				`{"ImportPath":"example.com/d","Action":"build-fail"}`,
			),
			wantOK: true, wantFailed: true,
			wantOut: []string{"d.go:1: syntax error"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			allow, err := parseAllow(strings.NewReader(allowList))
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			res, err := run(strings.NewReader(tc.in), &out, allow, false)
			if err != nil {
				t.Fatal(err)
			}
			ok := report(&out, res)
			if ok != tc.wantOK || res.failed != tc.wantFailed {
				t.Errorf("ok %v, failed %v; want %v, %v\n%s", ok, res.failed, tc.wantOK, tc.wantFailed, out.String())
			}
			for _, w := range tc.wantOut {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			for _, w := range tc.wantNotOut {
				if strings.Contains(out.String(), w) {
					t.Errorf("output has %q:\n%s", w, out.String())
				}
			}
		})
	}
}

func TestParseAllowRefusesAnEntryWithoutReason(t *testing.T) {
	if _, err := parseAllow(strings.NewReader("example.com/a TestX\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("parseAllow = %v, want an error naming line 1", err)
	}
}
