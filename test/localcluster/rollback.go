package localcluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/tessera-dev/tessera/test/helm"
)

// UpgradeChart runs a plain `helm upgrade` of the release with the plugin
// configuration cfg and values merged over the harness's own (for example
// {"controller": {"logVerbosity": 5}}), then waits until the plugin's
// DaemonSet and, when the release has it, the controller's Deployment have
// rolled out (see UpgradePlugin and StartController for what that means).
// Chart mode only, on an installed release.
func (c *Cluster) UpgradeChart(ctx context.Context, cfg PluginConfig, values map[string]any) error {
	if !c.ChartMode() {
		return fmt.Errorf("UpgradeChart needs install mode %s (this cluster: %s)", InstallChart, c.Opts.Install)
	}
	st := c.chartState()
	if !st.installed || !st.plugin {
		return errors.New("UpgradeChart: the release is not installed with the kubelet plugin; start the plugin first")
	}
	if cfg.Profile == "" {
		cfg.Profile = DefaultProfile
	}
	st.pluginCfg, st.values = cfg, values
	return c.installPlugin(ctx, st, func(m pluginMark) error { return c.waitChart(ctx, st, m) })
}

// RollbackChart runs `helm rollback` of the release to the revision before
// the last install or upgrade this Cluster value made, restores the
// harness's record of what is installed to that revision's, and waits as
// UpgradeChart does. It returns the time from the start of `helm rollback`
// until the plugin and the controller were rolled out and ready. One step
// back only: a second call without an upgrade in between is an error.
func (c *Cluster) RollbackChart(ctx context.Context) (time.Duration, error) {
	if !c.ChartMode() {
		return 0, fmt.Errorf("RollbackChart needs install mode %s (this cluster: %s)", InstallChart, c.Opts.Install)
	}
	c.mu.Lock()
	cur, prev := c.chart, c.previousChart
	c.mu.Unlock()
	if !prev.installed || !cur.installed {
		return 0, errors.New("RollbackChart: no earlier revision installed by this harness to roll back to")
	}
	rev, err := c.ChartRevision(ctx)
	if err != nil {
		return 0, err
	}
	if rev < 2 {
		return 0, fmt.Errorf("RollbackChart: release revision %d has no predecessor", rev)
	}
	m, err := c.markPlugin(ctx)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	args := []string{"rollback", helm.ReleaseName, strconv.Itoa(rev - 1), "--namespace", ChartNamespace, "--kubeconfig", c.Kubeconfig, "--timeout", "3m"}
	c.logf("helm %v", args)
	hctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := c.Helm(hctx, args...); err != nil {
		return 0, err
	}
	// The values files go on counting; the rest is the earlier state.
	prev.revision = cur.revision
	c.mu.Lock()
	c.chart, c.previousChart = prev, chartState{}
	c.plugin = prev.pluginCfg
	c.mu.Unlock()
	if err := c.waitChart(ctx, prev, m); err != nil {
		return 0, err
	}
	took := time.Since(start)
	c.logf("helm rollback to revision %d: plugin and controller ready after %s", rev-1, took.Round(10*time.Millisecond))
	return took, nil
}

// waitChart waits for the rollout of what st runs.
func (c *Cluster) waitChart(ctx context.Context, st chartState, m pluginMark) error {
	if st.plugin {
		if err := c.waitPluginRollout(ctx, st.pluginCfg, m); err != nil {
			return err
		}
	}
	if st.controller {
		return c.waitController(ctx)
	}
	return nil
}
