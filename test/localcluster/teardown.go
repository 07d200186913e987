package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DriverNamespaces hold the driver's own pods (in chart mode the plugin's
// DaemonSet pod and the controller's), which teardown deletes after every
// other pod (their plugin must unprepare the others' claims first). The
// release's namespaced objects go with them; the cluster-scoped ones
// (DeviceClasses, the Queue CRD, webhook configurations) with etcd's data.
var DriverNamespaces = []string{ChartNamespace}

// Down stops every component and removes all state of the cluster: no
// process, mount, cgroup, socket, CDI spec of Tessera or kubelet state is left.
// Logs and log archives in the work directory stay. The order follows what
// keeps claims consistent: controllers first, then pods are deleted while the
// kubelet and the DRA plugin still run (so claims are unprepared), then the
// plugin, the kubelet, the API server and etcd, then containers and
// containerd. Down is safe on a half-started, interrupted or absent cluster.
// It refuses while another live process owns the cluster (see owner.go).
func (c *Cluster) Down() error {
	c.downMu.Lock()
	defer c.downMu.Unlock()
	if err := c.checkNotInUse(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var errs []error
	note := func(err error) {
		if err != nil {
			c.logf("teardown: %v", err)
			errs = append(errs, err)
		}
	}
	anything := false
	for _, n := range allComponents {
		if _, err := os.Stat(c.pidFile(n)); err == nil {
			anything = true
		}
	}
	if anything {
		c.logf("tearing down the cluster in %s", c.Dirs.Root)
	}

	// 1. Controllers: nothing may create new pods or claims meanwhile.
	for _, n := range []string{compKueue, compController, compCM, compScheduler, compKwok} {
		note(c.stop(n, 10*time.Second))
	}
	// 2. Pods, while kubelet and plugin still run; the driver's own last
	// (kube-controller-manager is stopped: no DaemonSet or ReplicaSet
	// recreates them).
	if c.running(compAPIServer) && c.running(compKubelet) {
		note(c.deletePods(ctx, false))
		c.saveDriverPodLogs() // the kubelet may drop them with the pods
		note(c.deletePods(ctx, true))
	}
	// 3. The plugin, then 4. kubelet, API server, etcd.
	note(c.stop(compPlugin, 15*time.Second))
	note(c.stop(compKubelet, 15*time.Second))
	note(c.stop(compAPIServer, 15*time.Second))
	note(c.stop(compEtcd, 15*time.Second))
	// Containers: kill what runs in the kubepods cgroups and delete the
	// tasks while containerd still runs, then stop containerd.
	killCgroupProcs()
	if c.running(compContainerd) {
		c.deleteTasks(ctx)
	}
	note(c.stop(compContainerd, 15*time.Second))
	// The chart's container logs live in the kubelet's pod log directory,
	// which goes below: keep a copy with the component logs (again: the
	// driver pods may have logged their shutdown since).
	c.saveDriverPodLogs()
	// 5. Shims are re-parented to PID 1 and outlive containerd.
	note(c.killShims())
	killCgroupProcs()
	// 6. Mounts, cgroups, files.
	note(c.unmountAll())
	note(removeKubepodsCgroups())
	removeKubeletIptablesChains()
	c.removeNewEmptyNftTables()
	note(c.removeState())
	if anything {
		c.logf("teardown done")
	}
	return errors.Join(errs...)
}

func (c *Cluster) deletePods(ctx context.Context, driverPods bool) error {
	if c.Client == nil {
		if err := c.connect(); err != nil {
			return err
		}
	}
	isDriver := func(ns string) bool {
		for _, d := range DriverNamespaces {
			if ns == d {
				return true
			}
		}
		return false
	}
	list := func() ([]corev1.Pod, error) {
		pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		var out []corev1.Pod
		for _, p := range pods.Items {
			if isDriver(p.Namespace) == driverPods {
				out = append(out, p)
			}
		}
		return out, nil
	}
	pods, err := list()
	if err != nil || len(pods) == 0 {
		return err
	}
	c.logf("deleting %d pod(s) so the kubelet unprepares their claims", len(pods))
	// Pods that are not on the real node (on fake nodes of the scale
	// benchmarks, or not scheduled) have no kubelet to wait for: delete them
	// at once, a namespace per call.
	elsewhere := map[string]bool{}
	grace, now := int64(2), int64(0)
	for _, p := range pods {
		if p.Spec.NodeName != NodeName {
			elsewhere[p.Namespace] = true
			continue
		}
		_ = c.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
	}
	for ns := range elsewhere {
		_ = c.Client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &now},
			metav1.ListOptions{FieldSelector: "spec.nodeName!=" + NodeName})
	}
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		pods, err := list()
		if err == nil && len(pods) == 0 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if pods, _ := list(); len(pods) > 0 {
		return fmt.Errorf("%d pod(s) still exist 90s after deletion", len(pods))
	}
	if !driverPods && (c.running(compPlugin) || c.driverPluginPodRunning(ctx)) {
		// The plugin removes a claim's CDI spec when the kubelet unprepares it.
		deadline := time.Now().Add(30 * time.Second)
		for len(tesseraCDISpecs()) > 0 && time.Now().Before(deadline) {
			time.Sleep(250 * time.Millisecond)
		}
		if left := tesseraCDISpecs(); len(left) > 0 {
			return fmt.Errorf("CDI specs still present after all pods were deleted (claims not unprepared?): %v", left)
		}
	}
	return nil
}

// driverPluginPodRunning tells whether a pod of the chart's kubelet plugin
// runs its container (whatever this Cluster value installed: Down also
// runs on a fresh handle).
func (c *Cluster) driverPluginPodRunning(ctx context.Context) bool {
	if c.Client == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pods, err := c.driverPods(ctx, "kubelet-plugin")
	if err != nil {
		return false
	}
	for i := range pods {
		if cs := containerStatus(&pods[i], pluginContainer); cs != nil && cs.State.Running != nil {
			return true
		}
	}
	return false
}

// tesseraCDISpecs lists the CDI spec files Tessera's plugin wrote.
func tesseraCDISpecs() []string {
	var out []string
	entries, _ := os.ReadDir(CDIRoot)
	for _, e := range entries {
		if strings.Contains(e.Name(), "tessera") {
			out = append(out, filepath.Join(CDIRoot, e.Name()))
		}
	}
	return out
}

func (c *Cluster) deleteTasks(ctx context.Context) {
	out, err := c.ctr(ctx, "-n", "k8s.io", "tasks", "ls", "-q")
	if err != nil {
		return
	}
	for _, id := range strings.Fields(out) {
		_, _ = c.ctr(ctx, "-n", "k8s.io", "tasks", "kill", "-a", "-s", "SIGKILL", id)
		_, _ = c.ctr(ctx, "-n", "k8s.io", "tasks", "rm", "-f", id)
	}
}

// cgroupMounts lists the mount points of the cgroup hierarchies (v1 and v2).
func cgroupMounts() []string {
	return mountPoints(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
}

// mountPoints lists the mount points of /proc/self/mountinfo that filter keeps.
func mountPoints(filter mountinfo.FilterFunc) []string {
	infos, err := mountinfo.GetMounts(filter)
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(infos))
	for _, m := range infos {
		out = append(out, m.Mountpoint)
	}
	return out
}

// kubepodsDirs lists every cgroup directory the kubelet made, deepest first.
func kubepodsDirs() []string {
	var dirs []string
	for _, root := range cgroupMounts() {
		top := filepath.Join(root, "kubepods")
		_ = filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	return dirs
}

// killCgroupProcs SIGKILLs every process in the kubelet's kubepods cgroups:
// container processes, whatever containerd or the shims are doing.
func killCgroupProcs() {
	for _, d := range kubepodsDirs() {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

func removeKubepodsCgroups() error {
	var last error
	for attempt := 0; attempt < 50; attempt++ {
		dirs := kubepodsDirs()
		if len(dirs) == 0 {
			return nil
		}
		last = nil
		for _, d := range dirs {
			if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
				last = fmt.Errorf("rmdir %s: %w", d, err)
			}
		}
		if last == nil {
			return nil
		}
		killCgroupProcs()
		time.Sleep(200 * time.Millisecond)
	}
	return last
}

// killShims kills containerd-shim-runc-v2 processes that belong to this
// cluster's containerd (their command line names its socket), by PID.
func (c *Cluster) killShims() error {
	procs, _ := Processes("/proc")
	var errs []error
	for pid, args := range procs {
		if !strings.HasSuffix(args[0], "containerd-shim-runc-v2") || !strings.Contains(strings.Join(args, "\x00"), c.Dirs.ContainerdSocket) {
			continue
		}
		c.logf("killing leftover shim pid %d", pid)
		if err := stopPID(pid, args[0], 0); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// ownMountRoots are the trees whose mounts belong to the cluster.
func (c *Cluster) ownMountRoots() []string {
	return []string{KubeletRootDir, c.Dirs.Root, "/run/containerd"}
}

// underAny keeps the mounts at or below any of roots.
func underAny(roots []string) mountinfo.FilterFunc {
	filters := make([]mountinfo.FilterFunc, len(roots))
	for i, r := range roots {
		filters[i] = mountinfo.PrefixFilter(r)
	}
	return func(m *mountinfo.Info) (skip, stop bool) {
		for _, f := range filters {
			if skip, _ := f(m); !skip {
				return false, false
			}
		}
		return true, false
	}
}

// unmountAll unmounts everything under the cluster's trees, deepest first.
func (c *Cluster) unmountAll() error {
	var left []string
	for round := 0; round < 5; round++ {
		left = mountPoints(underAny(c.ownMountRoots()))
		if len(left) == 0 {
			return nil
		}
		sort.Slice(left, func(i, j int) bool { return len(left[i]) > len(left[j]) })
		for _, p := range left {
			if err := syscall.Unmount(p, 0); err != nil {
				_ = syscall.Unmount(p, syscall.MNT_DETACH)
			}
		}
	}
	return fmt.Errorf("still mounted: %v", left)
}

// otherContainerdRunning tells whether a containerd that is not ours runs
// (then /run/containerd is not ours to remove).
func otherContainerdRunning() bool {
	procs, _ := Processes("/proc")
	for _, args := range procs {
		if filepath.Base(args[0]) == "containerd" {
			return true
		}
	}
	return false
}

// removeState deletes the kubelet's root, etcd data, containerd state, the
// generated configuration and certificates, and Tessera's CDI specs. Logs
// and archives stay.
func (c *Cluster) removeState() error {
	var errs []error
	rm := func(p string) {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	rm(KubeletRootDir)
	entries, _ := os.ReadDir(c.Dirs.Root)
	if !otherContainerdRunning() {
		rm("/run/containerd")
	}
	for _, p := range tesseraCDISpecs() {
		rm(p)
	}
	// The kubelet links container logs of its pods here.
	links, _ := os.ReadDir(containerLogLinks)
	for _, l := range links {
		p := filepath.Join(containerLogLinks, l.Name())
		if target, err := os.Readlink(p); err == nil && under(target, c.podLogsDir()) {
			rm(p)
		}
	}
	if _, err := os.Stat(c.createdLogLinksMarker()); err == nil {
		_ = os.Remove(containerLogLinks) // only when empty
	}
	for _, e := range entries {
		if p := filepath.Join(c.Dirs.Root, e.Name()); p != c.Dirs.Logs && p != c.Dirs.Archive && e.Name() != ownerFileName && e.Name() != ownerLockName {
			rm(p)
		}
	}
	return errors.Join(errs...)
}

// removeKubeletIptablesChains deletes the chains the kubelet always makes
// (KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY, KUBE-FIREWALL and the jumps to it)
// once it is stopped. Nothing else here uses them: there is no kube-proxy.
func removeKubeletIptablesChains() {
	for _, bin := range []string{"iptables", "ip6tables"} {
		path, err := exec.LookPath(bin)
		if err != nil {
			continue
		}
		ipt := func(args ...string) error {
			return exec.Command(path, append([]string{"-w", "5"}, args...)...).Run()
		}
		for _, chain := range []string{"INPUT", "OUTPUT"} {
			for i := 0; i < 10 && ipt("-t", "filter", "-D", chain, "-j", "KUBE-FIREWALL") == nil; i++ {
			}
		}
		for _, tc := range [][2]string{
			{"filter", "KUBE-FIREWALL"},
			{"filter", "KUBE-KUBELET-CANARY"},
			{"nat", "KUBE-KUBELET-CANARY"},
			{"mangle", "KUBE-KUBELET-CANARY"},
			{"mangle", "KUBE-IPTABLES-HINT"},
		} {
			if ipt("-t", tc[0], "-F", tc[1]) == nil {
				_ = ipt("-t", tc[0], "-X", tc[1])
			}
		}
	}
}

// nftTablesFile records which nftables tables existed before the kubelet
// started: the iptables-nft tables it made for its chains are removed again
// by teardown when they are empty.
func (c *Cluster) nftTablesFile() string { return filepath.Join(c.Dirs.Root, "host-nft-tables") }

func nftTables() ([]string, bool) {
	out, err := exec.Command("nft", "list", "tables").Output()
	if err != nil {
		return nil, false
	}
	var tables []string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "table" {
			tables = append(tables, f[1]+" "+f[2])
		}
	}
	return tables, true
}

// containerLogLinks is where the kubelet links container logs (fixed).
const containerLogLinks = "/var/log/containers"

// createdLogLinksMarker exists when the cluster's kubelet made
// containerLogLinks, which teardown then removes again.
func (c *Cluster) createdLogLinksMarker() string {
	return filepath.Join(c.Dirs.Root, "created-var-log-containers")
}

// recordHostState notes what existed before the kubelet started, so that
// teardown removes only what the cluster made.
func (c *Cluster) recordHostState() error {
	if _, err := os.Stat(containerLogLinks); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(c.createdLogLinksMarker(), nil, 0o644); err != nil {
			return err
		}
	}
	return c.recordNftTables()
}

func (c *Cluster) recordNftTables() error {
	tables, ok := nftTables()
	if !ok {
		return nil
	}
	return os.WriteFile(c.nftTablesFile(), []byte(strings.Join(tables, "\n")+"\n"), 0o644)
}

func (c *Cluster) removeNewEmptyNftTables() {
	b, err := os.ReadFile(c.nftTablesFile())
	if err != nil {
		return
	}
	before := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		before[strings.TrimSpace(l)] = true
	}
	now, _ := nftTables()
	for _, t := range now {
		if before[t] {
			continue
		}
		f := strings.Fields(t)
		out, err := exec.Command("nft", "list", "table", f[0], f[1]).Output()
		if err != nil {
			continue
		}
		empty := true
		for _, l := range strings.Split(string(out), "\n") {
			l = strings.TrimSpace(l)
			if l == "" || l == "}" || strings.HasPrefix(l, "table ") || strings.HasPrefix(l, "chain ") || strings.HasPrefix(l, "type ") {
				continue
			}
			empty = false // a rule, set, map...
		}
		if empty {
			_ = exec.Command("nft", "delete", "table", f[0], f[1]).Run()
		}
	}
}

// podLogsDir is the kubelet's podLogsDir.
func (c *Cluster) podLogsDir() string { return filepath.Join(c.Dirs.Root, "pod-logs") }
