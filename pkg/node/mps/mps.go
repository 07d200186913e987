// Package mps runs one CUDA MPS control daemon per claim, with the claim's
// limits set on the daemon side so that a tenant cannot raise them, and a
// pipe directory only that claim's containers mount.
//
// A claim's daemon lives in <root>/<claimUID>/{pipe,log}. Start runs
// `nvidia-cuda-mps-control -d` with CUDA_MPS_PIPE_DIRECTORY,
// CUDA_MPS_LOG_DIRECTORY and CUDA_VISIBLE_DEVICES set, then sends
// `set_default_device_pinned_mem_limit <uuid> <N>M` per device and
// `set_default_active_thread_percentage <pct>` on the control's stdin. Stop
// sends `quit` and removes the directories. Both are idempotent: Start
// first stops whatever an earlier start left.
package mps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// Control runs the MPS control program: Daemon starts a daemon with env,
// Send gives a running daemon commands (one per line) on the control's
// stdin.
type Control interface {
	Daemon(ctx context.Context, env []string) error
	Send(ctx context.Context, env []string, commands []string) error
}

// Device is a GPU the daemon serves and its memory limit.
type Device struct {
	UUID   string
	MemMiB uint64
}

// Limits are a claim's daemon-side limits.
type Limits struct {
	Devices []Device
	// ThreadPercent is the active thread percentage, 0 for no limit.
	ThreadPercent int
}

// Commands returns the control commands that set the limits.
func (l Limits) Commands() []string {
	var out []string
	for _, d := range l.Devices {
		out = append(out, fmt.Sprintf("set_default_device_pinned_mem_limit %s %dM", d.UUID, d.MemMiB))
	}
	if l.ThreadPercent > 0 && l.ThreadPercent < 100 {
		out = append(out, fmt.Sprintf("set_default_active_thread_percentage %d", l.ThreadPercent))
	}
	return out
}

// Daemons runs the per-claim daemons, in the plugin's own process
// (Manager) or in pods of their own (package mpspod). Every method is
// idempotent.
type Daemons interface {
	// Dir holds one directory per claim with a daemon (<Dir>/<claimUID>).
	Dir() string
	// PipeDir is the claim's pipe directory on the host.
	PipeDir(uid string) string
	// Start runs the claim's daemon with its limits, or finds it running,
	// and returns its pipe directory once the limits are set.
	Start(ctx context.Context, uid string, l Limits) (string, error)
	// Running says whether the claim's daemon serves.
	Running(ctx context.Context, uid string) bool
	// Stop ends the claim's daemon and removes its directories.
	Stop(ctx context.Context, uid string) error
}

// Located is implemented by Daemons that run a claim's daemon somewhere
// worth recording (a Pod): Where names it, e.g. namespace/name.
type Located interface {
	Where(uid string) string
}

// Dirs is the layout of the per-claim directories under Root:
// <Root>/<uid>/pipe, <Root>/<uid>/log and the ready file <Root>/<uid>/ready
// (written by a daemon pod once its limits are set; outside the pipe
// directory, which the claim's containers mount).
type Dirs struct{ Root string }

// PipeDir is the claim's pipe directory on the host.
func (d Dirs) PipeDir(uid string) string { return filepath.Join(d.Root, uid, "pipe") }

// LogDir is the claim's daemon log directory on the host.
func (d Dirs) LogDir(uid string) string { return filepath.Join(d.Root, uid, "log") }

// ClaimDir holds the claim's pipe and log directories.
func (d Dirs) ClaimDir(uid string) string { return filepath.Join(d.Root, uid) }

// ReadyFile is written by a daemon pod once its limits are set.
func (d Dirs) ReadyFile(uid string) string { return filepath.Join(d.Root, uid, "ready") }

// Env is the daemon's environment: its pipe and log directories and the
// GPUs it serves.
func (d Dirs) Env(uid string, devices []Device) []string {
	uuids := make([]string, 0, len(devices))
	for _, dev := range devices {
		uuids = append(uuids, dev.UUID)
	}
	return []string{
		"CUDA_MPS_PIPE_DIRECTORY=" + d.PipeDir(uid),
		"CUDA_MPS_LOG_DIRECTORY=" + d.LogDir(uid),
		"CUDA_VISIBLE_DEVICES=" + strings.Join(uuids, ","),
	}
}

// Make creates the claim's pipe and log directories; the pipe directory
// is world-writable because the claim's containers may run as any user
// and must open the pipes.
func (d Dirs) Make(uid string) error {
	pipe := d.PipeDir(uid)
	for _, dir := range []string{pipe, d.LogDir(uid)} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	return os.Chmod(pipe, 0o777)
}

// Remove removes the claim's directories.
func (d Dirs) Remove(uid string) error {
	if err := os.RemoveAll(d.ClaimDir(uid)); err != nil {
		return fmt.Errorf("remove the MPS directories of claim %s: %w", uid, err)
	}
	return nil
}

// Manager starts and stops per-claim daemons under Root as children of the
// plugin's own process.
type Manager struct {
	Root    string
	Control Control
}

var _ Daemons = Manager{}

// Dir is Root.
func (m Manager) Dir() string { return m.Root }

// PipeDir is the claim's pipe directory on the host.
func (m Manager) PipeDir(uid string) string { return Dirs{m.Root}.PipeDir(uid) }

func (m Manager) env(uid string, devices []Device) []string { return Dirs{m.Root}.Env(uid, devices) }

// Start runs the claim's daemon with its limits; what an earlier start
// left is stopped first.
func (m Manager) Start(ctx context.Context, uid string, l Limits) (string, error) {
	if err := m.Stop(ctx, uid); err != nil {
		return "", err
	}
	pipe := m.PipeDir(uid)
	if err := (Dirs{m.Root}).Make(uid); err != nil {
		return "", err
	}
	env := m.env(uid, l.Devices)
	if err := m.Control.Daemon(ctx, env); err != nil {
		return "", fmt.Errorf("start the MPS control daemon of claim %s: %w", uid, err)
	}
	if err := m.Control.Send(ctx, env, l.Commands()); err != nil {
		_ = m.Stop(ctx, uid)
		return "", fmt.Errorf("set the MPS limits of claim %s: %w", uid, err)
	}
	klog.FromContext(ctx).V(2).Info("Started MPS control daemon", "claim", uid, "pipe", pipe, "commands", l.Commands())
	return pipe, nil
}

// Running says whether the claim's daemon has its control pipe.
func (m Manager) Running(_ context.Context, uid string) bool {
	_, err := os.Stat(filepath.Join(m.PipeDir(uid), "control"))
	return err == nil
}

// Stop quits the claim's daemon, if one runs, and removes its
// directories. A claim without one is fine.
func (m Manager) Stop(ctx context.Context, uid string) error {
	if m.Running(ctx, uid) {
		if err := m.Control.Send(ctx, m.env(uid, nil), []string{"quit"}); err != nil {
			// A control pipe left by a daemon that is gone (a reboot, a
			// crash) cannot be quit; without its pipe directory no client
			// reaches a daemon that is still there either.
			klog.FromContext(ctx).Error(err, "Could not quit the MPS control daemon of a claim; removing its pipe directory", "claim", uid)
		} else {
			klog.FromContext(ctx).V(2).Info("Stopped MPS control daemon", "claim", uid)
		}
	}
	return Dirs{m.Root}.Remove(uid)
}

// Exec runs the real nvidia-cuda-mps-control binary.
type Exec struct {
	// Path of nvidia-cuda-mps-control.
	Path string
}

// Daemon runs `<path> -d`, which forks the daemon and returns.
func (e Exec) Daemon(ctx context.Context, env []string) error {
	return e.run(ctx, env, nil, "-d")
}

// Send writes the commands to the control's stdin.
func (e Exec) Send(ctx context.Context, env []string, commands []string) error {
	if len(commands) == 0 {
		return nil
	}
	return e.run(ctx, env, []byte(strings.Join(commands, "\n")+"\n"))
}

func (e Exec) run(ctx context.Context, env []string, stdin []byte, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.Path, args...)
	cmd.Env = append(os.Environ(), env...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", e.Path, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// Fake stands in for nvidia-cuda-mps-control in mock mode and tests: a
// daemon is its pipe directory with a "control" file, and every command
// is appended to <pipe>/commands (so a test, or a container that mounts
// the pipe directory, sees what the daemon was told). quit removes the
// control file.
type Fake struct{}

func pipeOf(env []string) (string, error) {
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "CUDA_MPS_PIPE_DIRECTORY="); ok {
			return v, nil
		}
	}
	return "", errors.New("CUDA_MPS_PIPE_DIRECTORY is not set")
}

// Daemon creates the control file.
func (Fake) Daemon(_ context.Context, env []string) error {
	pipe, err := pipeOf(env)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(pipe, "control"), []byte(strings.Join(env, "\n")+"\n"), 0o644)
}

// Send records the commands; quit stops the fake daemon.
func (Fake) Send(_ context.Context, env []string, commands []string) error {
	pipe, err := pipeOf(env)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(pipe, "control")); err != nil {
		return fmt.Errorf("no MPS control daemon at %s: %w", pipe, err)
	}
	f, err := os.OpenFile(filepath.Join(pipe, "commands"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(strings.Join(commands, "\n") + "\n")
	if err := f.Close(); werr == nil {
		werr = err
	}
	if werr != nil {
		return werr
	}
	for _, c := range commands {
		if c == "quit" {
			return os.Remove(filepath.Join(pipe, "control"))
		}
	}
	return nil
}
