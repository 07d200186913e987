package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// benchResult is one benchmark line of `go test -bench`: its iterations and
// figures by unit (ns/op, prepare-p99-ms, workloads/s, ...).
type benchResult struct {
	N       int
	Figures map[string]float64
}

// goBenchRun is one `go test -bench` invocation.
type goBenchRun struct {
	pkg, pattern, benchtime string
	env                     []string
	// dir is where go test runs (another revision's worktree); empty:
	// here.
	dir string
}

// command is the command line users run to reproduce the figures.
func (g goBenchRun) command() string {
	env := strings.Join(g.env, " ")
	if env != "" {
		env += " "
	}
	return fmt.Sprintf("%sgo test -run='^$' -bench='%s' -benchtime=%s %s", env, g.pattern, g.benchtime, g.pkg)
}

var cpuSuffix = regexp.MustCompile(`-\d+$`)

// run runs the benchmarks and returns their results by name, without the
// "Benchmark" prefix and the GOMAXPROCS suffix ("PrepareLatency/share").
func (g goBenchRun) run() (map[string]benchResult, error) {
	cmd := exec.Command("go", "test", "-run=^$", "-bench="+g.pattern, "-benchtime="+g.benchtime, g.pkg)
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	cmd.Env = append(cmd.Env, g.env...)
	cmd.Dir = g.dir
	fmt.Fprintf(os.Stderr, "bench: %s\n", g.command())
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", g.command(), err, tail(string(out), 20))
	}
	res := parseBench(out)
	if len(res) == 0 {
		return nil, fmt.Errorf("%s: no benchmark matched\n%s", g.command(), tail(string(out), 20))
	}
	return res, nil
}

// parseBench reads the benchmark lines of `go test -bench` output.
func parseBench(out []byte) map[string]benchResult {
	res := map[string]benchResult{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		r := benchResult{N: n, Figures: map[string]float64{}}
		for i := 2; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				r.Figures[f[i+1]] = v
			}
		}
		res[cpuSuffix.ReplaceAllString(strings.TrimPrefix(f[0], "Benchmark"), "")] = r
	}
	return res
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
