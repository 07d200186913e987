package mps

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseDaemon(t *testing.T) {
	env := []string{"PATH=/usr/bin", "CUDA_MPS_PIPE_DIRECTORY=/p", "CUDA_MPS_LOG_DIRECTORY=/l", "CUDA_VISIBLE_DEVICES=GPU-1", "HOME=/root"}
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want string // error substring; "" for success
	}{
		{name: "fake", args: []string{"--control=fake", "--ready-file=/r", "--command=a b", "--command=c"}, env: env},
		{name: "no control", args: []string{"--ready-file=/r"}, env: env, want: "--control is required"},
		{name: "no ready file", args: []string{"--control=fake"}, env: env, want: "--ready-file is required"},
		{name: "no pipe directory", args: []string{"--control=fake", "--ready-file=/r"}, env: []string{"PATH=/usr/bin"}, want: "CUDA_MPS_PIPE_DIRECTORY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := ParseDaemon(tc.args, tc.env, io.Discard)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := d.Control.(Fake); !ok || len(d.Commands) != 2 || d.Commands[0] != "a b" || len(d.Env) != 3 || d.ReadyFile != "/r" {
				t.Errorf("%+v", d)
			}
		})
	}
}

// TestDaemonRun: the daemon pod's process starts the daemon, sets the
// limits, then writes the ready file; on its signal it quits the daemon.
func TestDaemonRun(t *testing.T) {
	dirs := Dirs{Root: t.TempDir()}
	if err := dirs.Make("c"); err != nil {
		t.Fatal(err)
	}
	l := Limits{Devices: []Device{{UUID: "GPU-1", MemMiB: 1024}}}
	d := Daemon{Control: Fake{}, Env: dirs.Env("c", l.Devices), Commands: l.Commands(), ReadyFile: dirs.ReadyFile("c")}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- d.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(d.ReadyFile); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no ready file")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cmds, err := os.ReadFile(filepath.Join(dirs.PipeDir("c"), "commands"))
	if err != nil || !strings.Contains(string(cmds), "set_default_device_pinned_mem_limit GPU-1 1024M") {
		t.Errorf("commands %q (%v): the limits are not set before ready", cmds, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if (Manager{Root: dirs.Root}).Running(t.Context(), "c") {
		t.Error("the daemon still runs after the signal")
	}
	if _, err := os.Stat(d.ReadyFile); !os.IsNotExist(err) {
		t.Errorf("ready file left: %v", err)
	}
}
