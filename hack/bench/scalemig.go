package main

import (
	"fmt"

	"github.com/tessera-dev/tessera/test/scale"
)

// migRatios are the Ratios rows of the dynamic-MIG workload against its
// share baseline (test/scale/mig.go): time until all bound, pods bound per
// second and the scheduler's CPU per pod, each MIG ÷ shares; none when the
// run has not both.
func migRatios(rep *scale.Report) []string {
	m, s := rep.Find(scale.MIGName), rep.Find(scale.MIGSharesName)
	if m == nil || s == nil {
		return nil
	}
	what := fmt.Sprintf("(m) %d pods, a MIG %s each, nodes in dynamic MIG mode, vs %d share pods, both in queues", m.Pods, scale.MIGProfile, s.Pods)
	rows := []string{fmt.Sprintf("| %s: time until all bound | **%.2fx** | %s vs %s |", what, m.AllBound.Seconds()/s.AllBound.Seconds(), secs(m.AllBound), secs(s.AllBound))}
	rows = append(rows, fmt.Sprintf("| (m) vs its share baseline: pods bound/s | %.2fx | %.1f vs %.1f pods/s |", m.Rate()/s.Rate(), m.Rate(), s.Rate()))
	if mc, sc := m.CPUPerPod("kube-scheduler"), s.CPUPerPod("kube-scheduler"); sc > 0 {
		rows = append(rows, fmt.Sprintf("| (m) vs its share baseline: kube-scheduler CPU per pod | %.2fx | %s vs %s |", float64(mc)/float64(sc), ms(mc), ms(sc)))
	}
	if mc, sc := m.CPUPerPod("controller"), s.CPUPerPod("controller"); sc > 0 {
		rows = append(rows, fmt.Sprintf("| (m) vs its share baseline: Tessera controller CPU per pod | %.2fx | %s vs %s |", float64(mc)/float64(sc), ms(mc), ms(sc)))
	}
	return rows
}

// migSetup is the setup paragraph's sentence on the dynamic-MIG workload;
// "" when the run has none.
func migSetup(cfg scale.Config) string {
	if cfg.MIGPods == 0 {
		return ""
	}
	return fmt.Sprintf("Workload (m) republishes every node's slices as the plugin builds them with its GPUs in dynamic MIG mode (`--mock-mig=all --mig-mode=dynamic`: every MIG profile x placement, about 200 devices with shared counters per 8 x H100 node), creates %d pods that each ask one `%s` partition through DeviceClass `mig.tessera.dev`, spread over the share queues, and restores the ordinary slices afterwards (republishing is not timed); its baseline is %d share pods in the same queues, measured right before on the ordinary slices. ", cfg.MIGPods, scale.MIGProfile, cfg.MIGPods)
}
