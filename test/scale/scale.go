package scale

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/test/localcluster"
)

// ControllerMetricsURL is where the chart's controller serves its metrics
// on the local cluster (deployments/helm/values/localcluster.yaml).
const ControllerMetricsURL = "http://127.0.0.1:18080/metrics"

// Report is a whole scale run.
type Report struct {
	Config      Config
	GPUsPerNode int
	// DevicesPerNode and MIGDevicesPerNode are the devices a node
	// publishes, ordinarily and with its GPUs in dynamic MIG mode (the (m)
	// workload's slices); 0 when not known.
	DevicesPerNode, MIGDevicesPerNode int
	// ClusterUp is the bring-up (chart, kwok), Setup the fake nodes,
	// their slices and the queues.
	ClusterUp, Setup time.Duration
	// Total is the whole run, from the bring-up to the end of the last
	// workload (teardown not counted); PeerStart the part of it spent
	// starting Kueue, its one-time build included when it was not cached.
	Total, PeerStart time.Duration
	Runs             []*Result
	// ProfileDir holds the merged CPU profiles (NAME-WORKLOAD.pb.gz).
	ProfileDir string
	// Shares is the share-admission scenario of the peer comparison
	// (Tessera vs Kueue); nil when it did not run.
	Shares *ShareAdmission
	// Failed says which workload stopped the run, and why; "" when every
	// workload ran. Runs are the workloads measured before it.
	Failed string
}

// Find returns the run of the workload named name, or nil.
func (r *Report) Find(name string) *Result {
	for _, run := range r.Runs {
		if run.Name == name {
			return run
		}
	}
	return nil
}

// Run brings a local cluster up (ClusterOptions), starts the kwok
// controller, creates cfg.Nodes fake nodes with the plugin's slices and the
// queues, measures every workload in turn and tears the cluster down. When
// a workload fails it returns the error and, with it, the report of the
// workloads measured before (Report.Failed says which one stopped it).
func Run(ctx context.Context, cfg Config, logf localcluster.Logf) (*Report, error) {
	return onCluster(ctx, cfg, logf, func(ctx context.Context, h *harness, cl *localcluster.Cluster, rep *Report) error {
		for _, w := range workloads(cfg) {
			run, err := h.measure(ctx, w)
			if err != nil {
				// What was measured until then is kept: the report says
				// where the run stopped and why.
				rep.Failed = fmt.Sprintf("%s: %v", w.title, err)
				return err
			}
			rep.Runs = append(rep.Runs, run)
		}
		// Last: the peer comparison with Kueue, which is stopped after it.
		if cfg.NoPeer {
			return nil
		}
		return runPeer(ctx, h, cl, rep)
	})
}

// onCluster brings the cluster of a scale run up with its fake nodes and
// queues, runs body on it and tears it down. body's error comes back with
// the report (and the components' log tails).
func onCluster(ctx context.Context, cfg Config, logf localcluster.Logf, body func(context.Context, *harness, *localcluster.Cluster, *Report) error) (rep *Report, err error) {
	start := time.Now()
	cl, err := localcluster.Up(ctx, ClusterOptions(logf))
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if dir, aerr := cl.ArchiveLogs("scale"); aerr == nil {
				logf("logs archived in %s", dir)
			}
		}
		err = errors.Join(err, cl.Down())
	}()
	if err := cl.StartKwok(ctx); err != nil {
		return nil, err
	}
	rep = &Report{Config: cfg, ClusterUp: time.Since(start)}
	admin, err := clientcmd.BuildConfigFromFlags("", cl.Kubeconfig)
	if err != nil {
		return nil, err
	}
	// The harness must not be what limits the rate of pod creation.
	admin.QPS, admin.Burst = 5000, 10000
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return nil, err
	}
	s, err := scheme()
	if err != nil {
		return nil, err
	}
	crc, err := client.New(admin, client.Options{Scheme: s})
	if err != nil {
		return nil, err
	}
	eps, err := endpoints(admin, ControllerMetricsURL, map[string]int{
		"scheduler":          localcluster.SchedulerPort,
		"controller-manager": localcluster.ControllerManagerPort,
	})
	if err != nil {
		return nil, err
	}
	setupStart := time.Now()
	if rep.GPUsPerNode, rep.DevicesPerNode, err = setUp(ctx, cs, crc, cfg, logf); err != nil {
		return nil, err
	}
	rep.Setup = time.Since(setupStart)
	if cfg.MIGPods > 0 {
		if rep.MIGDevicesPerNode, err = devicesPerNode(ctx, cfg.Profile, true); err != nil {
			return nil, err
		}
	}
	h := &harness{cfg: cfg, cs: cs, crc: crc, endpoints: eps, logf: logf, profileDir: cfg.ProfileDir}
	if h.profileDir == "" {
		if h.profileDir, err = os.MkdirTemp("", "tessera-scale-profiles-"); err != nil {
			return nil, err
		}
	}
	rep.ProfileDir = h.profileDir
	err = body(ctx, h, cl, rep)
	rep.Total = time.Since(start)
	if err != nil {
		return rep, fmt.Errorf("%w\n%s", err, cl.LogTails(30))
	}
	return rep, nil
}
