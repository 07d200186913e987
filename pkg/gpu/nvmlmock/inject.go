package nvmlmock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
)

// InjectFileName is the file in the mock state directory that
// WatchInjectFile reads.
const InjectFileName = "inject-xid"

// xidFallenOffBus is the XID of a GPU that fell off the bus: the mock GPU
// then fails GetPerformanceState (the health probe) with ERROR_GPU_IS_LOST
// until InjectRecovery; discovery still sees it, so slices can carry the
// taint.
const xidFallenOffBus = 79

// Lost says whether the GPU fell off the bus (XID 79) and was not
// recovered since.
func (d *Device) Lost() bool { return d.lost.Load() }

// InjectRecovery brings a GPU back as a reset would: a lost GPU answers
// NVML again. It delivers no event; the health monitor sees the GPU answer
// at its next probe.
func (s *Server) InjectRecovery(gpuUUID string) error {
	for _, d := range s.devices {
		if d.UUID == gpuUUID {
			d.lost.Store(false)
			return nil
		}
	}
	return fmt.Errorf("no mock GPU with UUID %q", gpuUUID)
}

// InjectXIDOnInstance queues an XID error event that NVML attributes to a
// MIG GPU instance of the GPU.
func (s *Server) InjectXIDOnInstance(gpuUUID string, xid uint64, gpuInstanceID uint32) error {
	for _, d := range s.devices {
		if d.UUID == gpuUUID {
			s.events <- nvml.EventData{Device: d, EventType: nvml.EventTypeXidCriticalError, EventData: xid, GpuInstanceId: gpuInstanceID, ComputeInstanceId: 0xFFFFFFFF}
			return nil
		}
	}
	return fmt.Errorf("no mock GPU with UUID %q", gpuUUID)
}

// WatchInjectFile lets tests outside the process inject faults: every
// interval it takes the file at path (renaming it first, so lines written
// meanwhile land in a new file) and injects one XID or recovery per line:
//
//	<gpu-uuid-or-index> <xid> [<gpu-instance-id>]
//	<gpu-uuid-or-index> recover
//
// e.g. `echo "0 79" >> <mock state dir>/inject-xid`. Bad lines are logged
// and skipped. It returns when ctx ends.
func (s *Server) WatchInjectFile(ctx context.Context, path string, interval time.Duration) {
	logger := klog.FromContext(ctx)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := s.injectFromFile(path); err != nil {
			logger.Error(err, "Mock fault injection", "file", path)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) injectFromFile(path string) error {
	taken := path + ".processing"
	if err := os.Rename(path, taken); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	defer os.Remove(taken)
	f, err := os.Open(taken)
	if err != nil {
		return err
	}
	defer f.Close()
	var errs []error
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := s.injectLine(line); err != nil {
			errs = append(errs, fmt.Errorf("line %q: %w", line, err))
		}
	}
	return errors.Join(append(errs, sc.Err())...)
}

func (s *Server) injectLine(line string) error {
	fields := strings.Fields(line)
	if len(fields) < 2 || len(fields) > 3 {
		return errors.New("want `<gpu-uuid-or-index> <xid> [<gpu-instance-id>]` or `<gpu-uuid-or-index> recover`")
	}
	uuid := fields[0]
	if i, err := strconv.Atoi(fields[0]); err == nil {
		if i < 0 || i >= len(s.devices) {
			return fmt.Errorf("no mock GPU with index %d", i)
		}
		uuid = s.devices[i].UUID
	}
	if fields[1] == "recover" && len(fields) == 2 {
		return s.InjectRecovery(uuid)
	}
	xid, err := strconv.ParseUint(fields[1], 10, 64)
	if err != nil {
		return fmt.Errorf("XID %q is not a number", fields[1])
	}
	if len(fields) == 3 {
		gi, err := strconv.ParseUint(fields[2], 10, 32)
		if err != nil {
			return fmt.Errorf("GPU instance %q is not a number", fields[2])
		}
		return s.InjectXIDOnInstance(uuid, xid, uint32(gi))
	}
	return s.InjectXID(uuid, xid)
}
