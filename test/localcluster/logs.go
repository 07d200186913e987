package localcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ArchiveLogs copies every component log into <work>/archive/<time>-<reason>
// and returns that directory. The five newest archives are kept.
func (c *Cluster) ArchiveLogs(reason string) (string, error) {
	dst := filepath.Join(c.Dirs.Archive, time.Now().Format("20060102-150405")+"-"+reason)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return "", err
	}
	entries, err := os.ReadDir(c.Dirs.Logs)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(c.Dirs.Logs, e.Name()))
		if err != nil {
			continue
		}
		_ = os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644)
	}
	c.copyDriverPodLogs(dst)
	if old, err := os.ReadDir(c.Dirs.Archive); err == nil && len(old) > 5 {
		for _, e := range old[:len(old)-5] { // names sort by time
			_ = os.RemoveAll(filepath.Join(c.Dirs.Archive, e.Name()))
		}
	}
	return dst, nil
}

// LogTails returns the last n lines of every component log, for printing
// when a test fails.
func (c *Cluster) LogTails(n int) string {
	var sb strings.Builder
	for _, name := range allComponents {
		if _, err := os.Stat(c.LogPath(name)); err != nil {
			continue
		}
		fmt.Fprintf(&sb, "===== last %d lines of %s =====\n%s\n", n, c.LogPath(name), c.LogTail(name, n))
	}
	// The chart's pods (plugin, controller): from the kubelet's pod logs
	// while they exist, else from the copies teardown saved.
	podLogs := c.driverPodLogs()
	if len(podLogs) == 0 {
		podLogs, _ = filepath.Glob(filepath.Join(c.Dirs.Logs, "pod_*.log"))
	}
	for _, p := range podLogs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		fmt.Fprintf(&sb, "===== last %d lines of %s =====\n%s\n", n, p, tail(string(b), n))
	}
	return sb.String()
}
