package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// There can be one cluster per machine (fixed ports, /var/lib/kubelet), and
// bring-up starts with a teardown. So that one user's `make demo` or e2e run
// never tears down another's running cluster, the process that brings a
// cluster up records itself in <work>/owner (PID, start time, command line).
// While that process lives, Up in another process waits for it (printing
// progress) and Down in another process refuses. A dead owner frees the
// cluster, so a cluster left running on purpose (CLI `up`, `make demo
// --keep`, TESSERA_E2E_KEEP=1) belongs to whoever comes next.

const (
	ownerFileName = "owner"
	ownerLockName = "owner.lock"
)

// ownerWait is how long Up waits for another live owner before failing.
var ownerWait = 30 * time.Minute

// Owner is the process that brought the cluster up.
type Owner struct {
	PID     int
	Start   string // /proc/<pid>/stat start time, against PID reuse
	Command string
}

func (c *Cluster) ownerFile() string { return filepath.Join(c.Dirs.Root, ownerFileName) }

// procStart is a process's start time in clock ticks since boot, "" when it
// does not exist.
func procStart(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+1:])
	// After the command: state is field 3, starttime field 22.
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return ""
	}
	return f[19]
}

func procCommand(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	cmd := strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
	if len(cmd) > 160 {
		cmd = cmd[:157] + "..."
	}
	return cmd
}

// CurrentOwner returns the live process other than this one that owns the
// cluster, or nil.
func (c *Cluster) CurrentOwner() *Owner {
	b, err := os.ReadFile(c.ownerFile())
	if err != nil {
		return nil
	}
	f := strings.SplitN(strings.TrimSpace(string(b)), "\n", 3)
	if len(f) < 2 {
		return nil
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil || pid == os.Getpid() {
		return nil
	}
	if start := procStart(pid); start == "" || start != f[1] {
		return nil // gone, or the PID was reused
	}
	o := &Owner{PID: pid, Start: f[1]}
	if len(f) > 2 {
		o.Command = f[2]
	}
	return o
}

func (o *Owner) String() string {
	return fmt.Sprintf("pid %d (%s)", o.PID, o.Command)
}

// claimOwnership waits until no other live process owns the cluster, then
// records this one.
func (c *Cluster) claimOwnership(ctx context.Context) error {
	if err := os.MkdirAll(c.Dirs.Root, 0o755); err != nil {
		return err
	}
	start := time.Now()
	lastNote := time.Time{}
	for {
		unlock, err := lockFile(filepath.Join(c.Dirs.Root, ownerLockName))
		if err != nil {
			return err
		}
		o := c.CurrentOwner()
		if o == nil {
			me := os.Getpid()
			err := os.WriteFile(c.ownerFile(), fmt.Appendf(nil, "%d\n%s\n%s\n", me, procStart(me), procCommand(me)), 0o644)
			unlock()
			return err
		}
		unlock()
		if time.Since(start) > ownerWait {
			return fmt.Errorf("the local cluster in %s is still in use by %s after %s; wait for it to finish or stop it", c.Dirs.Root, o, ownerWait)
		}
		if time.Since(lastNote) > 30*time.Second {
			c.logf("the local cluster is in use by %s (one cluster per machine); waiting for it to finish (%s so far, ^C to give up)", o, time.Since(start).Round(time.Second))
			lastNote = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s to release the local cluster: %w", o, ctx.Err())
		case <-time.After(2 * time.Second):
		}
	}
}

// errInUse is returned by Down when another live process owns the cluster.
var errInUse = errors.New("the local cluster is in use")

// checkNotInUse fails when another live process owns the cluster.
func (c *Cluster) checkNotInUse() error {
	if o := c.CurrentOwner(); o != nil {
		return fmt.Errorf("%w by %s, which tears it down itself when it ends; stop that process first", errInUse, o)
	}
	return nil
}
