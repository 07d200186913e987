package discover

import (
	"context"
	"io/fs"
	"os"

	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/gpu/inventory"
)

// SysFSProvider is an NVML implementation that brings its own sysfs: the
// mock GPUs, whose PCI devices exist only there.
type SysFSProvider interface {
	SysFS() fs.ReadLinkFS
}

// HostSysFS is the node's /sys. In the plugin's pod it is the host's: the
// PCI hierarchy under /sys/devices is not namespaced.
func HostSysFS() fs.ReadLinkFS {
	return os.DirFS(deviceattribute.SysfsRoot).(fs.ReadLinkFS)
}

// topology reads where the PCI device busID sits with the upstream helpers
// that other DRA drivers use, so that the standard attributes match theirs
// under matchAttribute. What cannot be read is left out (logged), never
// guessed: a VM's GPU often has no NUMA affinity (numa_node -1), and
// upstream refuses to publish a numaNode for it.
func topology(ctx context.Context, sysfs fs.ReadLinkFS, busID string) inventory.Topology {
	var t inventory.Topology
	if busID == "" || sysfs == nil {
		return t
	}
	logger := klog.FromContext(ctx)
	if a, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(busID, deviceattribute.WithFS(sysfs)); err != nil {
		logger.V(2).Info("No PCIe root for GPU", "pciBusID", busID, "reason", err)
	} else if a.Value.StringValue != nil {
		t.PCIeRoot = *a.Value.StringValue
	}
	if a, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(busID, deviceattribute.ScalarAttribute, deviceattribute.WithFS(sysfs)); err != nil {
		logger.V(2).Info("No NUMA node for GPU", "pciBusID", busID, "reason", err)
	} else if a.Value.IntValue != nil {
		t.NUMANode, t.HasNUMANode = int(*a.Value.IntValue), true
	}
	return t
}
