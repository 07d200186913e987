package main

import (
	"fmt"
	"time"

	"github.com/tessera-dev/tessera/test/scale"
)

// Targets of the control plane's cost: what queues add per pod
// to the API server, and what the controller holds per published device.
const (
	maxExtraWritesPerPod = 1.0  // API writes per admitted pod beyond (a')
	maxAPICPURatio       = 1.05 // API server CPU per pod, (a) ÷ (a')
	maxBytesPerDevice    = 1024 // controller memory per published device in (m)
	maxPeakVsScheduler   = 0.5  // controller peak ÷ kube-scheduler peak in (m)
)

// costTargets are the Targets rows of the control plane's cost, each with
// its measured figure; none for a workload the run lacks. maxRunTime is
// the run's own time target (0: none), Kueue's one-time build aside.
func costTargets(rep *scale.Report, maxRunTime time.Duration) []string {
	var rows []string
	row := func(what, measured string, met bool) {
		rows = append(rows, fmt.Sprintf("| %s | %s | %s |", what, measured, verdictOf(met)))
	}
	if a, a2 := rep.Find("shares"), rep.Find("claims"); a != nil && a2 != nil && a.Pods > 0 && a2.Pods > 0 {
		extra := a.APIWrites/float64(a.Pods) - a2.APIWrites/float64(a2.Pods)
		row(fmt.Sprintf("API writes per admitted pod in (a) beyond (a'), all clients: at most %.1f", maxExtraWritesPerPod),
			fmt.Sprintf("%+.2f (%.2f vs %.2f per pod)", extra, a.APIWrites/float64(a.Pods), a2.APIWrites/float64(a2.Pods)), extra <= maxExtraWritesPerPod)
		if ca, ca2 := a.CPUPerPod("kube-apiserver"), a2.CPUPerPod("kube-apiserver"); ca2 > 0 {
			r := float64(ca) / float64(ca2)
			row(fmt.Sprintf("API server CPU per pod, (a) ÷ (a'): at most %.2fx", maxAPICPURatio), fmt.Sprintf("%.2fx (%s vs %s)", r, ms(ca), ms(ca2)), r <= maxAPICPURatio)
		}
	}
	if rep.Total > 0 && maxRunTime > 0 {
		run := rep.Total - rep.PeerStart
		row(fmt.Sprintf("The run, bring-up to the last workload, under %s (starting Kueue, with its one-time build when not cached, reported apart)", maxRunTime),
			fmt.Sprintf("%s (+ %s starting Kueue)", run.Round(time.Second), rep.PeerStart.Round(time.Second)), run < maxRunTime)
	}
	m, base := rep.Find(scale.MIGName), rep.Find(scale.MIGSharesName)
	if m == nil || base == nil {
		return rows
	}
	mc, bc, sc := m.Usage["controller"].PeakRSS, base.Usage["controller"].PeakRSS, m.Usage["kube-scheduler"].PeakRSS
	if added := (rep.MIGDevicesPerNode - rep.DevicesPerNode) * rep.Config.Nodes; added > 0 && mc > 0 && bc > 0 {
		per := (float64(mc) - float64(bc)) / float64(added)
		row(fmt.Sprintf("Tessera controller's resident memory per published device, (m) against its baseline: at most %d B (%d more devices: %d per node instead of %d)", maxBytesPerDevice, added, rep.MIGDevicesPerNode, rep.DevicesPerNode),
			fmt.Sprintf("%.0f B (peak %s vs %s)", per, mib(mc), mib(bc)), per <= maxBytesPerDevice)
	}
	if mc > 0 && sc > 0 {
		r := float64(mc) / float64(sc)
		row(fmt.Sprintf("Tessera controller's peak resident memory in (m) under %.1fx kube-scheduler's", maxPeakVsScheduler), fmt.Sprintf("%.2fx (%s vs %s)", r, mib(mc), mib(sc)), r < maxPeakVsScheduler)
	}
	return rows
}

// zeroCostBound is what (a) ÷ (a') would be, on a machine whose cores
// every component keeps busy, if Tessera cost nothing: (a)'s CPU per pod
// without the controller's and without what the API server used beyond
// (a'), over (a')'s. 0 when a figure is missing.
func zeroCostBound(a, a2 *scale.Result) float64 {
	if a == nil || a2 == nil || a.Pods == 0 || a2.Pods == 0 || totalCPU(a2) == 0 {
		return 0
	}
	apiExtra := max(0, msPerPod(a.Usage["kube-apiserver"].CPU, a)-msPerPod(a2.Usage["kube-apiserver"].CPU, a2))
	without := msPerPod(totalCPU(a), a) - msPerPod(a.Usage["controller"].CPU, a) - apiExtra
	return without / msPerPod(totalCPU(a2), a2)
}
