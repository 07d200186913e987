package localcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A component is one host process of the cluster. Its PID and executable are
// recorded in <work>/pids/<name>.pid the moment it starts, so that any later
// run (even after this one was killed) can stop exactly that process.

func (c *Cluster) pidFile(name string) string { return filepath.Join(c.Dirs.Pids, name+".pid") }

// LogPath is the log file of a component (its stdout and stderr).
func (c *Cluster) LogPath(name string) string { return filepath.Join(c.Dirs.Logs, name+".log") }

// start runs bin with args as component name, with its output appended to
// the component's log file. env is the complete environment of the process:
// nothing of the harness's own environment leaks into it.
func (c *Cluster) start(name, bin string, args, env []string) error {
	logFile, err := os.OpenFile(c.LogPath(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	fmt.Fprintf(logFile, "=== %s %s\n", time.Now().Format(time.RFC3339), strings.Join(append([]string{bin}, args...), " "))
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Dir = c.Dirs.Root
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// A process group of its own: a ^C in the terminal reaches only the
	// harness, which then tears the cluster down in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	closeInheritedFDs()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	exited := make(chan struct{})
	c.mu.Lock()
	c.exited[name] = exited
	c.mu.Unlock()
	go func() { _ = cmd.Wait(); close(exited) }() // reap it while we live
	if err := os.WriteFile(c.pidFile(name), fmt.Appendf(nil, "%d\n%s\n", cmd.Process.Pid, bin), 0o644); err != nil {
		_ = cmd.Process.Kill()
		return err
	}
	c.logf("started %s (pid %d, log %s)", name, cmd.Process.Pid, c.LogPath(name))
	return nil
}

// closeInheritedFDs marks every descriptor above stderr close-on-exec, so
// that components do not inherit what the harness itself inherited (Go
// opens its own files close-on-exec, but not those a parent passed on):
// a lock held by a wrapper such as `flock <lock> go run ./hack/localcluster
// up` must end with the harness, not live on in the cluster's daemons.
func closeInheritedFDs() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}

// checkAlive returns an error when a component started by this Cluster value
// has exited, with the tail of its log.
func (c *Cluster) checkAlive(names ...string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range names {
		ch, ok := c.exited[n]
		if !ok {
			continue
		}
		select {
		case <-ch:
			return fmt.Errorf("%s exited; last lines of %s:\n%s", n, c.LogPath(n), c.LogTail(n, 25))
		default:
		}
	}
	return nil
}

// procAlive tells whether pid is a live (not zombie) process whose command
// line starts with exe.
func procAlive(pid int, exe string) bool {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(cmdline) == 0 {
		return false
	}
	argv0 := string(cmdline)
	if i := strings.IndexByte(argv0, 0); i >= 0 {
		argv0 = argv0[:i]
	}
	if exe != "" && argv0 != exe {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) && (s[i+2] == 'Z' || s[i+2] == 'X') {
		return false
	}
	return true
}

// readPidFile returns the recorded PID and executable of a component.
func readPidFile(path string) (int, string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, "", err
	}
	f := strings.Split(strings.TrimSpace(string(b)), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(f[0]))
	if err != nil {
		return 0, "", fmt.Errorf("bad pid file %s: %w", path, err)
	}
	exe := ""
	if len(f) > 1 {
		exe = strings.TrimSpace(f[1])
	}
	return pid, exe, nil
}

// running tells whether the recorded process of a component is alive.
func (c *Cluster) running(name string) bool {
	pid, exe, err := readPidFile(c.pidFile(name))
	return err == nil && procAlive(pid, exe)
}

// stop ends a component by its recorded PID: SIGTERM, then SIGKILL after
// grace. The PID is only signalled while its command line still names the
// recorded executable.
func (c *Cluster) stop(name string, grace time.Duration) error {
	path := c.pidFile(name)
	pid, exe, err := readPidFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		_ = os.Remove(path)
		return err
	}
	if procAlive(pid, exe) {
		c.logf("stopping %s (pid %d)", name, pid)
		if err := stopPID(pid, exe, grace); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// stopPID sends SIGTERM to pid and waits up to grace for it to go, then
// sends SIGKILL and waits again.
func stopPID(pid int, exe string, grace time.Duration) error {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if !procAlive(pid, exe) {
			return nil
		}
		_ = syscall.Kill(pid, sig)
		deadline := time.Now().Add(grace)
		if sig == syscall.SIGKILL {
			deadline = time.Now().Add(10 * time.Second)
		}
		for time.Now().Before(deadline) {
			if !procAlive(pid, exe) {
				return nil
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if procAlive(pid, exe) {
		return fmt.Errorf("pid %d (%s) survived SIGKILL", pid, exe)
	}
	return nil
}

// LogTail returns the last n lines of a component's log.
func (c *Cluster) LogTail(name string, n int) string {
	b, err := os.ReadFile(c.LogPath(name))
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	return tail(string(b), n)
}

// Processes lists the processes under procRoot ("/proc", or a copy of its
// layout) with their command lines, by pid. Kernel threads (an empty
// command line) and processes gone while listing are left out.
func Processes(procRoot string) (map[int][]string, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	out := map[int][]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		out[pid] = strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	}
	return out, nil
}
