package cli

import (
	"context"
	"runtime/debug"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

func TestSetMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	for _, tc := range []struct {
		name string
		env  map[string]string
		want int64
	}{
		{"90% of the container's limit", nil, 900 << 20},
		{"AUTOMEMLIMIT sets another ratio", map[string]string{"AUTOMEMLIMIT": "0.5"}, 500 << 20},
		{"GOMEMLIMIT wins", map[string]string{"GOMEMLIMIT": "123MiB"}, 42 << 20},
		{"AUTOMEMLIMIT=off leaves it", map[string]string{"AUTOMEMLIMIT": "off"}, 42 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			debug.SetMemoryLimit(42 << 20) // what the runtime had
			setMemoryLimit(context.Background(), memlimit.Limit(1000<<20))
			if got := debug.SetMemoryLimit(-1); got != tc.want {
				t.Errorf("memory limit %d MiB, want %d MiB", got>>20, tc.want>>20)
			}
		})
	}
}
