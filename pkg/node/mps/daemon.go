package mps

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/atomicfile"
)

// DaemonCommand is the kubelet plugin's subcommand that a daemon pod runs:
// `kubelet-plugin mps-daemon --control=<path|fake> --ready-file=<file>
// [--command=<control command>]...`, with CUDA_MPS_PIPE_DIRECTORY,
// CUDA_MPS_LOG_DIRECTORY and CUDA_VISIBLE_DEVICES in its environment.
const DaemonCommand = "mps-daemon"

// FakeControl is the --control value that selects the fake daemon (mock
// GPUs).
const FakeControl = "fake"

// Daemon is a daemon pod's main process: it starts the control daemon,
// sets the limits, writes ReadyFile, and on a signal quits the daemon.
type Daemon struct {
	Control   Control
	Env       []string
	Commands  []string
	ReadyFile string
}

// ParseDaemon reads the mps-daemon subcommand's arguments; env is the
// process environment, from which the CUDA_MPS_* and CUDA_VISIBLE_DEVICES
// variables are taken.
func ParseDaemon(args, env []string, stderr io.Writer) (Daemon, error) {
	fs := pflag.NewFlagSet(DaemonCommand, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	control := fs.String("control", "", "Path of nvidia-cuda-mps-control, or fake for the mock daemon.")
	ready := fs.String("ready-file", "", "File written once the daemon runs with its limits set.")
	commands := fs.StringArray("command", nil, "A control command sent after the daemon starts (repeatable), e.g. 'set_default_active_thread_percentage 50'.")
	if err := fs.Parse(args); err != nil {
		return Daemon{}, err
	}
	if *control == "" {
		return Daemon{}, errors.New("--control is required: the path of nvidia-cuda-mps-control, or fake")
	}
	if *ready == "" {
		return Daemon{}, errors.New("--ready-file is required")
	}
	d := Daemon{Commands: *commands, ReadyFile: *ready, Control: Exec{Path: *control}}
	if *control == FakeControl {
		d.Control = Fake{}
	}
	for _, e := range env {
		if strings.HasPrefix(e, "CUDA_MPS_") || strings.HasPrefix(e, "CUDA_VISIBLE_DEVICES=") {
			d.Env = append(d.Env, e)
		}
	}
	if _, err := pipeOf(d.Env); err != nil {
		return Daemon{}, fmt.Errorf("the daemon's environment: %w", err)
	}
	return d, nil
}

// Run starts the daemon, sets its limits, writes ReadyFile, then waits for
// ctx (the pod's SIGTERM) and quits the daemon.
func (d Daemon) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	_ = os.Remove(d.ReadyFile)
	if err := d.Control.Daemon(ctx, d.Env); err != nil {
		return fmt.Errorf("start the MPS control daemon: %w", err)
	}
	if err := d.Control.Send(ctx, d.Env, d.Commands); err != nil {
		d.quit(logger)
		return fmt.Errorf("set the MPS limits: %w", err)
	}
	if err := atomicfile.Write(d.ReadyFile, []byte(strings.Join(d.Commands, "\n")+"\n"), 0o644); err != nil {
		d.quit(logger)
		return fmt.Errorf("write the ready file: %w", err)
	}
	logger.Info("MPS control daemon runs with its limits set", "env", d.Env, "commands", d.Commands)
	<-ctx.Done()
	_ = os.Remove(d.ReadyFile)
	d.quit(logger)
	return nil
}

func (d Daemon) quit(logger klog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Control.Send(ctx, d.Env, []string{"quit"}); err != nil {
		logger.Error(err, "Could not quit the MPS control daemon")
		return
	}
	logger.Info("Quit the MPS control daemon")
}
