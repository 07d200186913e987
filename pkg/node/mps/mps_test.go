package mps

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"
)

const gpu0 = "GPU-00000000-0000-0000-0000-000000000000"

func TestCommands(t *testing.T) {
	tests := []struct {
		limits Limits
		want   []string
	}{
		{Limits{Devices: []Device{{gpu0, 4096}}, ThreadPercent: 30},
			[]string{"set_default_device_pinned_mem_limit " + gpu0 + " 4096M", "set_default_active_thread_percentage 30"}},
		{Limits{Devices: []Device{{gpu0, 1024}, {"GPU-1", 2048}}},
			[]string{"set_default_device_pinned_mem_limit " + gpu0 + " 1024M", "set_default_device_pinned_mem_limit GPU-1 2048M"}},
		{Limits{Devices: []Device{{gpu0, 1}}, ThreadPercent: 100}, []string{"set_default_device_pinned_mem_limit " + gpu0 + " 1M"}},
	}
	for _, tt := range tests {
		if got := tt.limits.Commands(); !slices.Equal(got, tt.want) {
			t.Errorf("%+v: %q, want %q", tt.limits, got, tt.want)
		}
	}
}

// TestManager runs the manager against the fake and against the Exec
// runner with a stand-in program, and checks start, limits, idempotent
// restart and stop.
func TestManager(t *testing.T) {
	script := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	// Records its arguments, environment and stdin like the fake does.
	if err := os.WriteFile(script, []byte(`#!/bin/sh
if [ "$1" = "-d" ]; then env | grep '^CUDA_' | sort > "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0; fi
[ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] || { echo "Cannot find MPS control daemon process" >&2; exit 1; }
while read -r line; do echo "$line" >> "$CUDA_MPS_PIPE_DIRECTORY/commands"; [ "$line" = quit ] && rm "$CUDA_MPS_PIPE_DIRECTORY/control"; done
exit 0
`), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, control := range map[string]Control{"fake": Fake{}, "exec": Exec{Path: script}} {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			m := Manager{Root: t.TempDir(), Control: control}
			lim := Limits{Devices: []Device{{gpu0, 4096}}, ThreadPercent: 30}
			pipe, err := m.Start(ctx, "uid-1", lim)
			if err != nil {
				t.Fatal(err)
			}
			if pipe != filepath.Join(m.Root, "uid-1", "pipe") || !m.Running(t.Context(), "uid-1") {
				t.Fatalf("pipe %s, running %v", pipe, m.Running(t.Context(), "uid-1"))
			}
			ctl, _ := os.ReadFile(filepath.Join(pipe, "control"))
			for _, w := range []string{"CUDA_MPS_PIPE_DIRECTORY=" + pipe, "CUDA_MPS_LOG_DIRECTORY=" + filepath.Join(m.Root, "uid-1", "log"), "CUDA_VISIBLE_DEVICES=" + gpu0} {
				if !strings.Contains(string(ctl), w) {
					t.Errorf("daemon environment lacks %s:\n%s", w, ctl)
				}
			}
			cmds, _ := os.ReadFile(filepath.Join(pipe, "commands"))
			if got := strings.Fields(strings.ReplaceAll(string(cmds), "\n", " | ")); !strings.Contains(string(cmds), "set_default_device_pinned_mem_limit "+gpu0+" 4096M\nset_default_active_thread_percentage 30\n") {
				t.Errorf("commands %q", got)
			}
			// A second start (a re-prepare) quits the old daemon first.
			if _, err := m.Start(ctx, "uid-1", lim); err != nil {
				t.Fatal(err)
			}
			if !m.Running(t.Context(), "uid-1") {
				t.Error("not running after restart")
			}
			// Another claim has its own pipe directory.
			pipe2, err := m.Start(ctx, "uid-2", Limits{Devices: []Device{{gpu0, 1024}}})
			if err != nil || pipe2 == pipe {
				t.Fatalf("second claim: %s %v", pipe2, err)
			}
			for _, uid := range []string{"uid-1", "uid-2", "uid-1"} {
				if err := m.Stop(ctx, uid); err != nil {
					t.Fatal(err)
				}
				if m.Running(t.Context(), uid) {
					t.Errorf("%s still running", uid)
				}
				if _, err := os.Stat(filepath.Join(m.Root, uid)); !os.IsNotExist(err) {
					t.Errorf("%s: directories left: %v", uid, err)
				}
			}
		})
	}
}
