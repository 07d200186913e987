package localcluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// schedulerArgs is kube-scheduler's command line: its own arguments,
// Options.ComponentArgs["kube-scheduler"], then extra on top (mergeArgs).
func (c *Cluster) schedulerArgs(extra []string) []string {
	return mergeArgs(c.args([]string{
		"--kubeconfig=" + c.SchedulerKubeconfig(),
		"--authentication-kubeconfig=" + c.SchedulerKubeconfig(),
		"--authorization-kubeconfig=" + c.SchedulerKubeconfig(),
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", SchedulerPort),
		"--cert-dir=" + filepath.Join(c.Dirs.PKI, "scheduler-generated"),
		"--leader-elect=false",
		"--feature-gates=" + featureGateFlag(),
		"--v=1",
	}, compScheduler), extra)
}

// SchedulerKubeconfig is the kubeconfig of kube-scheduler's identity; a
// KubeSchedulerConfiguration given with --config must name it in
// clientConnection.kubeconfig (kube-scheduler ignores --kubeconfig then).
func (c *Cluster) SchedulerKubeconfig() string {
	return filepath.Join(c.Dirs.Kubeconfigs, schedulerIdentity.name+".kubeconfig")
}

// mergeArgs returns base with extra on top: an extra "--name=value"
// replaces base's "--name=..." (a bare "--name" matches too), except
// --feature-gates, whose gates are added to base's (a gate named in both
// takes extra's value); any other extra argument is appended.
func mergeArgs(base, extra []string) []string {
	out := slices.Clone(base)
	for _, arg := range extra {
		name, value, _ := strings.Cut(arg, "=")
		i := slices.IndexFunc(out, func(a string) bool { return a == name || strings.HasPrefix(a, name+"=") })
		switch {
		case i < 0:
			out = append(out, arg)
		case name == "--feature-gates":
			_, have, _ := strings.Cut(out[i], "=")
			out[i] = name + "=" + mergeGates(have, value)
		default:
			out[i] = arg
		}
	}
	return out
}

// mergeGates adds the gates of extra ("A=true,B=false") to those of base,
// keeping base's order; a gate in both takes extra's value.
func mergeGates(base, extra string) string {
	var gates []string
	index := map[string]int{}
	for _, list := range []string{base, extra} {
		for _, g := range strings.Split(list, ",") {
			if g = strings.TrimSpace(g); g == "" {
				continue
			}
			name, _, _ := strings.Cut(g, "=")
			if i, ok := index[name]; ok {
				gates[i] = g
				continue
			}
			index[name] = len(gates)
			gates = append(gates, g)
		}
	}
	return strings.Join(gates, ",")
}

// RestartScheduler stops kube-scheduler and starts it again with extra
// arguments on top of its own (mergeArgs: e.g. "--config=FILE",
// "--feature-gates=SchedulerPreQueueingHints=true"; nil for its own). It
// returns once the new scheduler answers /readyz, which waits for its
// informers' caches: it runs with --leader-elect=false, so it schedules
// from then on. Pods created while it is down wait in the API server.
func (c *Cluster) RestartScheduler(ctx context.Context, extra []string) error {
	if err := c.stop(compScheduler, 10*time.Second); err != nil {
		return err
	}
	if err := c.start(compScheduler, c.Bin.KubeScheduler, c.schedulerArgs(extra), []string{c.hostPath()}); err != nil {
		return err
	}
	url := fmt.Sprintf("https://127.0.0.1:%d/readyz", SchedulerPort)
	return c.waitFor(ctx, compScheduler+" /readyz", 60*time.Second, []string{compScheduler}, func() (bool, error) {
		body, err := httpGet(url, &tls.Config{InsecureSkipVerify: true}) // self-signed, loopback only
		return err == nil && body == "ok", nil
	})
}
