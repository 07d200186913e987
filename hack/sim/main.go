// Command sim replays a GPU workload trace against a simulated cluster of
// mock GPU nodes with Tessera's published slices and the scheduler's DRA
// allocator, and compares sharing policies in one run.
//
//	go run ./hack/sim --trace showdown --nodes 1xt4
//	go run ./hack/sim --trace mixed --jobs 1000 --nodes '12xdgxh100;12xdgxa100;40xt4:4'
//	go run ./hack/sim --trace hack/sim/traces/mixed-1000.csv --nodes ... --queues 'training=1Ti:2Ti;inference=:'
//	go run ./hack/sim --snapshot state.yaml   # a saved `kubectl tessera snapshot`
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/tessera-dev/tessera/hack/internal/sim"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/snapshot"
	"github.com/tessera-dev/tessera/pkg/control/whatif"
)

func main() {
	trace := flag.String("trace", "showdown", "showdown, mixed (generated), or a CSV file name,kind,requestMiB,usageMiB")
	jobs := flag.Int("jobs", 1000, "jobs in a generated mixed trace")
	seed := flag.Uint64("seed", 1, "seed of the generated trace")
	nodes := flag.String("nodes", "1xt4", "node groups <count>x<mock profile>, separated by ';'")
	kind := flag.String("kind", "", "replay only the jobs of this kind (e.g. inference)")
	queues := flag.String("queues", "", "put jobs behind the controller's queues: <kind>=<quota>:<limit> of GPU memory, separated by ';' (other kinds go to queue default)")
	writeTrace := flag.String("write-trace", "", "write the trace as CSV to this file and exit")
	snapshot := flag.String("snapshot", "", "replay a saved `kubectl tessera snapshot`: one admission cycle of the controller's engine on it, every workload's outcome per queue (the other flags are ignored)")
	flag.Parse()
	if *snapshot != "" {
		fail(replaySnapshot(*snapshot))
		return
	}

	var js []sim.Job
	switch *trace {
	case "showdown":
		js = sim.Showdown()
	case "mixed":
		js = sim.Generate(*jobs, *seed, sim.DefaultMix)
	default:
		var err error
		if js, err = sim.ReadCSV(*trace); err != nil {
			fail(err)
		}
	}
	if *kind != "" {
		js = sim.Filter(js, *kind)
	}
	if *writeTrace != "" {
		f, err := os.Create(*writeTrace)
		if err != nil {
			fail(err)
		}
		if err := sim.WriteCSV(f, js); err != nil {
			fail(err)
		}
		fail(f.Close())
		return
	}
	groups, err := sim.ParseNodes(*nodes)
	if err != nil {
		fail(err)
	}
	cl := sim.Cluster{Nodes: groups}
	if *queues != "" {
		if cl.Queues, err = sim.ParseQueues(*queues); err != nil {
			fail(err)
		}
	}
	start := time.Now()
	results, err := sim.RunPolicies(context.Background(), cl, js)
	if err != nil {
		fail(err)
	}
	fmt.Printf("Trace %s (%d jobs) on %s, simulated in %s:\n\n", *trace, len(js), *nodes, time.Since(start).Round(time.Millisecond))
	sim.WriteMarkdown(os.Stdout, results)
}

// replaySnapshot decides one admission cycle on a saved state.
func replaySnapshot(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := snapshot.Load(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	start := time.Now()
	r, err := whatif.Decide(context.Background(), st, decide.DefaultConfig())
	if err != nil {
		return err
	}
	fmt.Printf("Snapshot %s (%d queues, %d queued pods, %d nodes), one admission cycle in %s:\n\n", path, len(st.Queues), len(st.Pods), len(st.Nodes), time.Since(start).Round(time.Millisecond))
	r.Print(os.Stdout)
	return nil
}

func fail(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "sim:", err)
		os.Exit(1)
	}
}
