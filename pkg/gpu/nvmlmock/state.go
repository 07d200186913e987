package nvmlmock

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-dev/tessera/pkg/atomicfile"
)

// state is what a real GPU keeps across a restart of the plugin: MIG mode
// and the MIG instances that exist.
type state struct {
	GPUs map[string]gpuState `json:"gpus"`
}

type gpuState struct {
	MIGMode int       `json:"migMode"`
	GIs     []giState `json:"gpuInstances,omitempty"`
}

type giState struct {
	ID        uint32    `json:"id"`
	ProfileID uint32    `json:"profileId"`
	Start     uint32    `json:"start"`
	Size      uint32    `json:"size"`
	CIs       []ciState `json:"computeInstances,omitempty"`
}

type ciState struct {
	ID        uint32 `json:"id"`
	ProfileID uint32 `json:"profileId"`
}

func (s *Server) load() error {
	data, err := os.ReadFile(s.opts.StatePath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("mock GPU state %s: %w", s.opts.StatePath, err)
	}
	var st state
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("mock GPU state %s is corrupt (%v); delete it to start with no MIG instances", s.opts.StatePath, err)
	}
	for _, d := range s.devices {
		g, ok := st.GPUs[d.UUID]
		if !ok || len(d.Model.MIG) == 0 {
			continue
		}
		d.migMode = g.MIGMode
		for _, gs := range g.GIs {
			d.nextGI = gs.ID
			gi, ret := d.createGILocked(gs.ProfileID, nvml.GpuInstancePlacement{Start: gs.Start, Size: gs.Size})
			if ret != nvml.SUCCESS {
				return fmt.Errorf("mock GPU state %s: GPU instance %d on %s cannot be restored: %s", s.opts.StatePath, gs.ID, d.UUID, nvml.ErrorString(ret))
			}
			for _, cs := range gs.CIs {
				gi.addCILocked(cs.ID, cs.ProfileID)
			}
		}
		for _, gi := range d.gis {
			if gi.id >= d.nextGI {
				d.nextGI = gi.id + 1
			}
		}
	}
	return nil
}

// saveLocked persists the MIG state; it returns an NVML code so mutating
// calls can fail the way a driver error would.
func (s *Server) saveLocked() nvml.Return {
	if s.opts.StatePath == "" {
		return nvml.SUCCESS
	}
	st := state{GPUs: map[string]gpuState{}}
	for _, d := range s.devices {
		if len(d.Model.MIG) == 0 {
			continue
		}
		g := gpuState{MIGMode: d.migMode}
		for _, gi := range d.sortedGIs() {
			gs := giState{ID: gi.id, ProfileID: gi.profile.Info.Id, Start: gi.placement.Start, Size: gi.placement.Size}
			for _, ci := range gi.sortedCIs() {
				gs.CIs = append(gs.CIs, ciState{ID: ci.id, ProfileID: ci.profileID})
			}
			g.GIs = append(g.GIs, gs)
		}
		st.GPUs[d.UUID] = g
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return nvml.ERROR_UNKNOWN
	}
	if err := atomicfile.Write(s.opts.StatePath, data, 0o600); err != nil {
		return nvml.ERROR_UNKNOWN
	}
	return nvml.SUCCESS
}
