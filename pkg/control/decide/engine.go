// Package decide decides which queued workloads start. One decision
// cycle takes a snapshot of the API (queues, labelled pods, claims,
// templates, slices, classes, nodes) and returns what to do: workloads to
// admit (remove the scheduling gate of every member), why the others wait,
// which over-quota workloads to evict for a queue below its quota, and the
// status of every queue.
//
// Order: queues by fair share (priority first, then the lower dominant
// share), hierarchically; within a queue by pod priority, then FIFO. Work
// that stays within quota on every queue up the hierarchy goes first
// (pass 1); over-quota work gets idle capacity afterwards (pass 2), unless
// a workload within quota waits for capacity that reclaim frees. A workload
// is admitted when every queue up the hierarchy stays within its limit and
// an in-process simulation with the scheduler's allocator places the claims
// of every member (all or nothing) over the live ResourceSlices and the
// current allocations.
//
// Accounting: claims the scheduler allocated are charged from their
// allocation (consumed capacity, the device's memory); admitted claims not
// yet allocated are charged what the simulation placed (kept between cycles
// as reservations so that the next cycle does not hand the same devices out
// again, and rebuilt by simulation after a restart); claims of pods that
// ended are not charged. A claim shared by several pods is charged once.
package decide

import (
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"

	"github.com/tessera-dev/tessera/pkg/control/catalog"
	"github.com/tessera-dev/tessera/pkg/control/queue"
)

// reservation is the simulated allocation of an admitted claim the
// scheduler has not allocated yet.
type reservation struct {
	node   string
	result resourceapi.AllocationResult
	charge queue.Vector
}

// Engine decides admission cycle after cycle (cycle.go). Between cycles it
// remembers only the reservations of admitted claims not yet allocated,
// and caches what it derived from the slices and classes while they are
// the same objects; everything else comes from the snapshot, so a new
// Engine (a restarted controller) rebuilds the same accounting from the
// API.
type Engine struct {
	cfg          Config
	mu           sync.Mutex
	cel          *cel.Cache
	reservations map[string]*reservation
	// What the last cycle derived from the slices and classes, kept while
	// they are the same objects: the catalog, the device indexes per node
	// and CEL results (placeCache).
	slices  []*resourceapi.ResourceSlice
	classes []*resourceapi.DeviceClass
	catalog *catalog.Catalog
	places  *placeCache
	// taints are the slices patched with DeviceTaintRules.
	taints *taintMemo
}

// NewEngine returns an engine.
func NewEngine(cfg Config) *Engine {
	return &Engine{cfg: cfg, cel: cel.NewCache(1000, cel.Features{}), reservations: map[string]*reservation{}}
}

// Forget drops what the engine remembers about the admission of these pods'
// claims, e.g. when ungating them failed.
func (e *Engine) Forget(pods ...*corev1.Pod) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range pods {
		prefix := "pod:" + string(p.UID) + "/"
		for k := range e.reservations {
			if strings.HasPrefix(k, prefix) {
				delete(e.reservations, k)
			}
		}
	}
}

// keepCatalog rebuilds the catalog when snap's slices or classes are not
// the objects it was built from (and drops the placement cache with the
// classes), and remembers them. Called with e.mu held.
func (e *Engine) keepCatalog(snap *Snapshot) {
	if !sameObjects(snap.Classes, e.classes) {
		e.catalog, e.places = nil, nil
	} else if !sameObjects(snap.Slices, e.slices) {
		e.catalog = nil
	}
	if e.catalog == nil {
		e.catalog = catalog.NewCatalog(snap.Slices, snap.Classes, e.cel, snap.Attributes)
	}
	e.slices, e.classes = snap.Slices, snap.Classes
}
