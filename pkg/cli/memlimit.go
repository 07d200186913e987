package cli

import (
	"context"
	"math"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"k8s.io/klog/v2"
)

// MemoryLimitRatio is the share of the container's memory limit the Go
// runtime's soft limit is set to: the rest is left for what the garbage
// collector does not count (stacks, the runtime's own structures).
const MemoryLimitRatio = 0.9

// SetMemoryLimit sets the Go runtime's soft memory limit (GOMEMLIMIT) to
// MemoryLimitRatio of the container's cgroup memory limit, so that the
// garbage collector works harder as the heap nears the limit instead of
// letting it grow to twice what is live and the kernel kill the process.
// The controller caches every ResourceSlice, and its live heap grows with
// the devices published (docs/tuning.md). GOMEMLIMIT in the environment
// wins; AUTOMEMLIMIT=off leaves the runtime's default, AUTOMEMLIMIT=0.8
// another ratio. Without a cgroup limit nothing changes.
func SetMemoryLimit(ctx context.Context) {
	setMemoryLimit(ctx, memlimit.FromCgroup)
}

func setMemoryLimit(ctx context.Context, provider memlimit.Provider) {
	logger := klog.FromContext(ctx)
	limit, err := memlimit.Set(memlimit.WithRatio(MemoryLimitRatio), memlimit.WithProvider(provider))
	switch {
	case err != nil:
		logger.Info("Warning: the Go memory limit was not set from the container's; the runtime's default stays", "err", err)
	case limit != math.MaxInt64:
		logger.V(1).Info("Go memory limit (GOMEMLIMIT)", "bytes", limit)
	}
}
