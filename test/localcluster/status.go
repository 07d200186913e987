package localcluster

import "encoding/json"

// ComponentStatus is one line of Status.
type ComponentStatus struct {
	Name    string `json:"name"`
	PID     int    `json:"pid,omitempty"`
	Running bool   `json:"running"`
	Log     string `json:"log"`
}

// Status reports every component that has a pid file.
func (c *Cluster) Status() []ComponentStatus {
	var out []ComponentStatus
	for _, n := range allComponents {
		pid, exe, err := readPidFile(c.pidFile(n))
		if err != nil {
			continue
		}
		out = append(out, ComponentStatus{Name: n, PID: pid, Running: procAlive(pid, exe), Log: c.LogPath(n)})
	}
	return out
}

// allComponents lists every component the harness may run.
var allComponents = []string{compEtcd, compContainerd, compAPIServer, compCM, compScheduler, compKubelet, compPlugin, compController, compKwok, compKueue}

// StatusJSON is what `status` prints.
func (c *Cluster) StatusJSON() string {
	b, _ := json.MarshalIndent(map[string]any{
		"workDir":    c.Dirs.Root,
		"install":    c.Opts.Install,
		"kubeconfig": c.Kubeconfig,
		"kubectl":    c.Bin.Kubectl,
		"components": c.Status(),
	}, "", "  ")
	return string(b)
}
