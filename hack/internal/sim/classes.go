package sim

import (
	"github.com/tessera-dev/tessera/deployments"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
)

// loadClasses returns the shipped DeviceClasses, so the simulator selects
// devices exactly as users' claims do.
func loadClasses() (allocation.Classes, error) {
	return deployments.DeviceClasses()
}
