package main

import (
	"fmt"

	"github.com/tessera-dev/tessera/test/localcluster"
	"github.com/tessera-dev/tessera/test/scale"
)

// The peer comparison's parts of the scale section: Kueue against
// Tessera's controller (test/scale/kueue.go).

// peerRatio is the Ratios row's comparison: (e) Kueue ÷ (e') Tessera.
func peerRatio(cfg scale.Config) (what, a, base string) {
	return fmt.Sprintf("(e) Kueue %s vs (e') Tessera's controller admitting the same %d whole-GPU pods (a queue, no gang)", localcluster.KueueVersion, cfg.BigGang),
		"kueue-whole", "queued-whole"
}

// writePeerSetup is the Setup text of the peer comparison.
func writePeerSetup(p func(string, ...any), cfg scale.Config) {
	p("**Peer** ([test/scale/kueue.go](../test/scale/kueue.go), [test/localcluster/kueue.go](../test/localcluster/kueue.go)): after every other workload, Kueue %s (`sigs.k8s.io/kueue`, built from the module proxy like kwok, its CRDs from the same module) runs as a host process against the same cluster with Kueue's shipped defaults (client QPS 50, burst 100; 5 concurrent Pod and Workload reconciles) and: only the `pod` integration; the `DynamicResourceAllocation` feature gate with `resources.deviceClassMappings` mapping DeviceClass `%s` to `%s` (one per device a claim asks for); no leader election; its webhooks (its own kinds' and the pod webhooks) served on 127.0.0.1 with a certificate the harness makes and registered with `url:` client configurations, the pod webhooks only for namespaces labelled `tessera.dev/bench-peer=kueue`, which is also its `managedJobsNamespaceSelector` (`manageJobsWithoutQueueName: false`). ", localcluster.KueueVersion, localcluster.DriverName, "tessera.dev/gpu")
	p("One ResourceFlavor, one ClusterQueue with %d `tessera.dev/gpu`, a LocalQueue in the workload's namespace; each pod names it (`kueue.x-k8s.io/queue-name`) and gets a Workload of its own. Tessera's webhooks select pods by `tessera.dev/queue` on the pod or its namespace, which Kueue's pods and namespaces lack, so neither admitter sees the other's pods. Each admitter is measured as a fresh process: Kueue is started for the peer run, and Tessera's controller pod is replaced right before it (so that its memory is not what the workloads before left, the dynamic-MIG one's above all). Afterwards the harness removes Kueue's webhook configurations and stops the manager by PID.\n\n", cfg.BigGang)
}

// writePeer writes the peer table and the share-admission scenario.
func writePeer(p func(string, ...any), rep *scale.Report) {
	e, e2, base := rep.Find("kueue-whole"), rep.Find("queued-whole"), rep.Find("ungated")
	if e == nil && rep.Shares == nil {
		return
	}
	p("\n### Peer: Kueue %s\n\n", localcluster.KueueVersion)
	if e != nil && e2 != nil {
		p("The same %d pods, a whole GPU each, admitted by each (Tessera's from a queue with a GPU quota and no gang; writes from the API server's `apiserver_request_total`, every client together, and beyond those of the same pods with no admitter (the ungated whole-GPU workload of this run): Kueue v0.17 serves no client-request counts of its own: its client metrics land in a registry its metrics endpoint does not serve):\n\n", e.Pods)
		p("| admitter | all bound | pods bound/s | API server writes per pod | beyond the same pods without admitter | admitter CPU per pod | admitter peak RSS |\n|---|---:|---:|---:|---:|---:|---:|\n")
		row := func(name string, r *scale.Result, comp string) {
			extra := "-"
			if base != nil {
				extra = fmt.Sprintf("%.2f", r.APIWrites/float64(r.Pods)-base.APIWrites/float64(base.Pods))
			}
			p("| %s | %s | %.1f | %.2f | %s | %.2f ms | %s |\n", name, secs(r.AllBound), r.Rate(), r.APIWrites/float64(r.Pods), extra,
				float64(r.CPUPerPod(comp).Microseconds())/1000, mib(r.Usage[comp].PeakRSS))
		}
		row("Tessera's controller (e')", e2, "controller")
		row("Kueue "+localcluster.KueueVersion+" (e)", e, "kueue")
		p("\n")
	}
	if s := rep.Shares; s != nil {
		p("**What each admits when pods ask memory shares.** Both get a quota of %d GPUs (Tessera: a Queue with `gpu.tessera.dev/gpus: %d`, GPU equivalents; Kueue: a ClusterQueue with `tessera.dev/gpu: %d`) and %d pods each, each with a claim for a %s memory share of a GPU (the share template of (a)). ", s.GPUs, s.GPUs, s.GPUs, s.Pods, s.Share)
		p("Pods bound once neither count changed for 10 s: **Tessera %d, Kueue %d**. ", s.Tessera, s.Kueue)
		p("Kueue %s counts devices per claim (a claim for one device is 1 `tessera.dev/gpu`, whatever capacity it asks), so %d GPUs of quota admit %d pods; Tessera charges the memory a share consumes against the GPU's, so the same quota admits as many shares as fit.\n", localcluster.KueueVersion, s.GPUs, s.GPUs)
	}
}
