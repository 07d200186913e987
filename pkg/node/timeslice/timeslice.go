// Package timeslice sets a GPU's scheduling time slice for the claims that
// ask for one. The interval is a property of the physical GPU, not of a
// claim: the first claim that asks sets it, later claims on the same GPU
// must ask for the same one (or not ask), and when the last claim that
// asked is unprepared the GPU goes back to Default.
package timeslice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/tessera-dev/tessera/pkg/keymutex"

	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/atomicfile"
)

// Setter applies an interval to a GPU.
type Setter interface {
	SetInterval(ctx context.Context, gpuUUID string, interval v1alpha1.TimeSliceInterval) error
}

// NvidiaSMI sets intervals with `nvidia-smi -i <uuid> compute-policy
// --set-timeslice <0..3>`.
type NvidiaSMI struct {
	// Path of nvidia-smi (--nvidia-smi).
	Path string
}

// SetInterval implements Setter.
func (n NvidiaSMI) SetInterval(ctx context.Context, gpuUUID string, interval v1alpha1.TimeSliceInterval) error {
	v := interval.Value()
	if v < 0 {
		return fmt.Errorf("unknown time-slice interval %q", interval)
	}
	out, err := exec.CommandContext(ctx, n.Path, "-i", gpuUUID, "compute-policy", "--set-timeslice", strconv.Itoa(v)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s -i %s compute-policy --set-timeslice %d: %w: %s", n.Path, gpuUUID, v, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// FileRecorder is the mock backend's GPU setting: it records the interval
// of each GPU in a JSON file (<mock state dir>/mock-timeslice.json), so
// that tests outside the process can see it.
type FileRecorder struct {
	Path string
	mu   sync.Mutex
}

// SetInterval implements Setter.
func (f *FileRecorder) SetInterval(ctx context.Context, gpuUUID string, interval v1alpha1.TimeSliceInterval) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	state, err := ReadRecorded(f.Path)
	if err != nil {
		state = map[string]v1alpha1.TimeSliceInterval{}
	}
	state[gpuUUID] = interval
	data, err := json.MarshalIndent(state, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(f.Path, data, 0o644)
}

// ReadRecorded reads a FileRecorder's file.
func ReadRecorded(path string) (map[string]v1alpha1.TimeSliceInterval, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]v1alpha1.TimeSliceInterval{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]v1alpha1.TimeSliceInterval{}
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// Holder is a claim that asked for an interval.
type Holder struct {
	UID string
	// Name is namespace/name, for messages.
	Name string
}

type gpuState struct {
	interval v1alpha1.TimeSliceInterval
	holders  map[string]Holder
}

// Manager tracks which claims hold which GPU's interval. Setting a GPU's
// interval (nvidia-smi: hundreds of milliseconds) holds only that GPU's
// lock, so claims on other GPUs are not held up.
type Manager struct {
	setter Setter
	mu     sync.Mutex
	gpus   map[string]*gpuState
	// locks serialize the changes of one GPU's interval.
	locks keymutex.Mutex
}

// NewManager returns a manager applying intervals with setter.
func NewManager(setter Setter) *Manager {
	return &Manager{setter: setter, gpus: map[string]*gpuState{}}
}

// lockGPU takes the GPU's lock and returns its release.
func (m *Manager) lockGPU(gpuUUID string) func() { return m.locks.Lock(gpuUUID) }

// state returns the GPU's state, created empty; the caller holds m.mu.
func (m *Manager) state(gpuUUID string) *gpuState {
	g := m.gpus[gpuUUID]
	if g == nil {
		g = &gpuState{holders: map[string]Holder{}}
		m.gpus[gpuUUID] = g
	}
	return g
}

// Conflict is the error of a claim asking for a different interval than
// the one the GPU is held at.
type Conflict struct {
	GPU       string
	Want      v1alpha1.TimeSliceInterval
	Held      v1alpha1.TimeSliceInterval
	HeldBy    []string
	Requester string
}

// Error is what the requester's tenant reads (the claim's status, the
// pod's events): it names the holders in the requester's own namespace and
// only counts the others, never naming another namespace's claims.
func (c *Conflict) Error() string {
	ns, _, _ := strings.Cut(c.Requester, "/")
	var own []string
	others := 0
	for _, h := range c.HeldBy {
		if hns, _, _ := strings.Cut(h, "/"); hns == ns {
			own = append(own, h)
		} else {
			others++
		}
	}
	var held []string
	if len(own) > 0 {
		held = append(held, "claim(s) "+strings.Join(own, ", "))
	}
	if others > 0 {
		held = append(held, fmt.Sprintf("%d claim(s) of other namespaces", others))
	}
	return fmt.Sprintf("time-slice interval conflict on GPU %s: claim %s asks for timeSliceInterval %s, but the GPU is set to %s for %s; "+
		"use the same timeSliceInterval, leave it unset, or use another GPU",
		c.GPU, c.Requester, c.Want, c.Held, strings.Join(held, " and "))
}

// Check reports whether a claim may ask for the interval on a GPU, without
// changing anything.
func (m *Manager) Check(gpuUUID string, claim Holder, interval v1alpha1.TimeSliceInterval) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.checkLocked(gpuUUID, claim, interval)
}

func (m *Manager) checkLocked(gpuUUID string, claim Holder, interval v1alpha1.TimeSliceInterval) error {
	g := m.gpus[gpuUUID]
	if g == nil || len(g.holders) == 0 || g.interval == interval {
		return nil
	}
	if _, ok := g.holders[claim.UID]; ok && len(g.holders) == 1 {
		return nil
	}
	var by []string
	for uid, h := range g.holders {
		if uid != claim.UID {
			by = append(by, h.Name)
		}
	}
	sort.Strings(by)
	return &Conflict{GPU: gpuUUID, Want: interval, Held: g.interval, HeldBy: by, Requester: claim.Name}
}

// Acquire makes the claim a holder of the interval on the GPU, setting it
// when the claim is the first to ask.
func (m *Manager) Acquire(ctx context.Context, gpuUUID string, claim Holder, interval v1alpha1.TimeSliceInterval) error {
	unlock := m.lockGPU(gpuUUID)
	defer unlock()
	m.mu.Lock()
	err := m.checkLocked(gpuUUID, claim, interval)
	g := m.state(gpuUUID)
	set := len(g.holders) == 0 || g.interval != interval
	m.mu.Unlock()
	if err != nil {
		return err
	}
	if set {
		if err := m.setter.SetInterval(ctx, gpuUUID, interval); err != nil {
			return fmt.Errorf("set time-slice interval %s on GPU %s: %w", interval, gpuUUID, err)
		}
		klog.FromContext(ctx).V(2).Info("Set GPU time-slice interval", "gpu", gpuUUID, "interval", interval, "claim", claim.Name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g = m.state(gpuUUID)
	g.interval = interval
	g.holders[claim.UID] = claim
	return nil
}

// Restore records a holder from the checkpoint at start, without setting
// anything (the GPU kept its interval).
func (m *Manager) Restore(gpuUUID string, claim Holder, interval v1alpha1.TimeSliceInterval) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.state(gpuUUID)
	g.interval = interval
	g.holders[claim.UID] = claim
}

// Reset forgets every holder, without setting anything; the caller
// restores the holders of the records it reloaded.
func (m *Manager) Reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gpus = map[string]*gpuState{}
}

// Release drops the claim; when no claim holds the GPU any more it goes
// back to Default.
func (m *Manager) Release(ctx context.Context, gpuUUID, claimUID string) error {
	unlock := m.lockGPU(gpuUUID)
	defer unlock()
	m.mu.Lock()
	g := m.gpus[gpuUUID]
	if g != nil {
		delete(g.holders, claimUID)
		if len(g.holders) > 0 || g.interval == v1alpha1.TimeSliceDefault {
			m.mu.Unlock()
			return nil
		}
	}
	m.mu.Unlock()
	if err := m.setter.SetInterval(ctx, gpuUUID, v1alpha1.TimeSliceDefault); err != nil {
		return fmt.Errorf("reset time-slice interval of GPU %s: %w", gpuUUID, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if g := m.gpus[gpuUUID]; g != nil && len(g.holders) == 0 {
		g.interval = v1alpha1.TimeSliceDefault
	}
	klog.FromContext(ctx).V(2).Info("Reset GPU time-slice interval", "gpu", gpuUUID)
	return nil
}

// Interval returns the interval a GPU is held at and its holders' names.
func (m *Manager) Interval(gpuUUID string) (v1alpha1.TimeSliceInterval, []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.gpus[gpuUUID]
	if g == nil || len(g.holders) == 0 {
		return "", nil
	}
	var names []string
	for _, h := range g.holders {
		names = append(names, h.Name)
	}
	slices.Sort(names)
	return g.interval, names
}
