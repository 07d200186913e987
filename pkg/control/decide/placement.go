package decide

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/podclaims"
	"github.com/tessera-dev/tessera/pkg/control/sliceintern"
)

// placeNode is a node as placement simulation sees it: its slices and what is
// allocated on it. The scheduler's allocator only looks at a node's own
// slices, so a per-node state is equivalent to the cluster's and keeps
// every simulation step small.
type placeNode struct {
	idx    int
	node   *corev1.Node
	slices []*resourceapi.ResourceSlice
	state  *allocation.State
	// version changes whenever state does; failures are cached per version.
	version uint64
	// usable: Ready and not cordoned. plain: usable and untainted.
	usable, plain bool
	// held counts the allocations of each device (exclusive or shared).
	held map[structured.DeviceID]int
	// deviceIndex is what the shortcuts derived from the slices.
	*deviceIndex
	// setVersion counts the allocation changes of each counter set (by
	// its number in the device index); blockedAt remembers alternatives
	// that found nothing on one; exclusive marks the devices allocated
	// exclusively (flat). All three exist once the index does (nodeIndex).
	setVersion []uint64
	blockedAt  map[blockKey]uint64
	exclusive  []bool
	// altFails are the capacity requests at which alternatives failed, at
	// version altFailsAt (see shortcuts.go).
	altFails   map[string][]map[resourceapi.QualifiedName]resource.Quantity
	altFailsAt uint64
	// withAttrs are the slices with their devices' attributes in the
	// API's form, made for this cycle's first call that passes all of
	// them to the allocator (allSlices).
	withAttrs []*resourceapi.ResourceSlice
}

// deviceIndex is what the shortcuts derive from a node's slices and the
// device classes alone: device IDs and positions, counter sets, which
// devices each selector, each alternative and each claim signature
// select. The engine keeps it from one cycle to the next while the node's
// slices and the classes are the same objects (an informer replaces an
// object that changes, never edits it).
type deviceIndex struct {
	from []*resourceapi.ResourceSlice
	// devices counts the devices of the slices; offsets is where each
	// slice's devices start in flat per-device vectors.
	devices int
	offsets []int
	// convertible caches placer.convertible per device (flat): 0 not
	// known yet, 1 no, 2 yes.
	convertible []int8
	ids         [][]structured.DeviceID
	positions   map[structured.DeviceID]devPos
	// counterSets are the counter sets each device consumes (flat), by
	// their numbers in setNames.
	counterSets [][]int32
	setNames    []string
	keyIDs      map[string][]int32  // per refs signature (placer.keyIDs)
	masks       map[string][][]bool // per claims' selector signature
	cands       map[string][]devPos // per alternative's selectors
	vectors     map[string][]bool   // per CEL expression
	// failing marks the CEL expressions (of vectors) that fail to compile
	// or to evaluate on some device of the node; failSigs caches
	// selectorsFail per claims' selector signature.
	failing  map[string]bool
	failSigs map[string]bool
}

func newDeviceIndex(slices []*resourceapi.ResourceSlice) *deviceIndex {
	return &deviceIndex{
		from:     slices,
		keyIDs:   map[string][]int32{},
		masks:    map[string][][]bool{},
		cands:    map[string][]devPos{},
		vectors:  map[string][]bool{},
		failing:  map[string]bool{},
		failSigs: map[string]bool{},
	}
}

// placeCache is what placers keep from one cycle to the next: the device
// indexes per node, and the CEL results per distinct device key, with
// the keys numbered per refs signature.
type placeCache struct {
	indexes  map[string]*deviceIndex
	keys     map[string]map[string]int32
	exprs    map[string]*exprResults
	versions versionCache
	// entries counts what the indexes gained (a vector, a candidate list,
	// a mask, key numbers), for full.
	entries int
}

func newPlaceCache() *placeCache {
	return &placeCache{
		indexes:  map[string]*deviceIndex{},
		keys:     map[string]map[string]int32{},
		exprs:    map[string]*exprResults{},
		versions: versionCache{},
	}
}

// maxCached bounds the device keys a placeCache holds and the entries its
// indexes gained: devices come and go (each with its UUIDs) and claims
// bring new selectors, so an engine starts afresh beyond it.
const maxCached = 1 << 17

// full says whether the cache holds more than maxCached keys or entries.
func (c *placeCache) full() bool {
	n := c.entries
	for _, space := range c.keys {
		n += len(space)
	}
	return n > maxCached
}

// sameObjects says whether a and b hold the same objects, in any order.
func sameObjects[T any](a, b []*T) bool {
	if len(a) != len(b) {
		return false
	}
	in := make(map[*T]bool, len(a))
	for _, o := range a {
		in[o] = true
	}
	for _, o := range b {
		if !in[o] {
			return false
		}
	}
	return true
}

// holding is an allocation a workload holds on a node.
type holding struct {
	node   *placeNode
	result *resourceapi.AllocationResult
}

// placer simulates placement with the scheduler's allocator, over a
// snapshot of nodes, slices and classes, for one cycle.
type placer struct {
	nodes    []*placeNode
	byName   map[string]*placeNode
	poolNode map[string]*placeNode // driver/pool -> node
	classes  allocation.Classes
	// ext resolves the extended resources DeviceClasses serve.
	ext      *podclaims.ExtendedResources
	features structured.Features
	cel      *cel.Cache
	fails    map[failKey]uint64
	fitCache map[filterKey]bool
	specSigs map[*resourceapi.ResourceClaim]string
	// specJSONs are the claims' specs as JSON; shapes are per spec.
	specJSONs map[*resourceapi.ResourceClaim]string
	calls     int
	// sharedFailures counts allocations not tried because the failure of
	// another claim implies theirs.
	sharedFailures int
	// exact turns the shortcuts of shortcuts.go off.
	exact    bool
	shapes   map[string]*claimShape
	blockIDs map[string]int
	cache    *placeCache
	// attrs reads the devices' attributes (Snapshot.Attributes).
	attrs  *sliceintern.Interner
	keyBuf []byte
	// Buffers of groupPrefix.
	inBuf            map[devPos]bool
	groupBuf, setBuf []int32
	// celEvaluations counts the evaluations the cached results did not spare.
	celEvaluations int
	// stripped and noSelectors are the claims and classes of
	// allocateListed's calls without selectors; strippedCalls counts
	// those calls, strippedConfirmed those checked by an exact call, and
	// strippedMismatches those the exact call did not confirm.
	stripped                                             map[strippedKey]*resourceapi.ResourceClaim
	noSelectors                                          allocation.Classes
	strippedCalls, strippedConfirmed, strippedMismatches int
}

type failKey struct {
	node int
	sig  string
}

type filterKey struct {
	node int
	sig  string
}

// newPlacer indexes the snapshot's nodes and slices. cache is what an
// earlier placer over the same classes kept (nil for none): a node whose
// slices are the same objects keeps its device index.
func newPlacer(nodes []*corev1.Node, all []*resourceapi.ResourceSlice, attrs *sliceintern.Interner, classes []*resourceapi.DeviceClass, features structured.Features, celCache *cel.Cache, exact bool, cache *placeCache) *placer {
	if cache == nil {
		cache = newPlaceCache()
	}
	c := &placer{
		exact:     exact,
		shapes:    map[string]*claimShape{},
		blockIDs:  map[string]int{},
		cache:     cache,
		attrs:     attrs,
		stripped:  map[strippedKey]*resourceapi.ResourceClaim{},
		byName:    map[string]*placeNode{},
		poolNode:  map[string]*placeNode{},
		classes:   allocation.Classes(classes),
		ext:       podclaims.NewExtendedResources(classes),
		features:  features,
		cel:       celCache,
		fails:     map[failKey]uint64{},
		fitCache:  map[filterKey]bool{},
		specSigs:  map[*resourceapi.ResourceClaim]string{},
		specJSONs: map[*resourceapi.ResourceClaim]string{},
	}
	sorted := append([]*corev1.Node(nil), nodes...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for i, n := range sorted {
		sn := &placeNode{idx: i, node: n, state: allocation.NewState(), held: map[structured.DeviceID]int{}, blockedAt: map[blockKey]uint64{}}
		sn.usable = !n.Spec.Unschedulable && nodeReady(n)
		sn.plain = sn.usable && len(n.Spec.Taints) == 0
		c.nodes = append(c.nodes, sn)
		c.byName[n.Name] = sn
	}
	// Only the newest generation of a pool is visible to the allocator
	// anyway; keep all and let it pick.
	for _, s := range all {
		name := ptr.Deref(s.Spec.NodeName, "")
		sn := c.byName[name]
		if sn == nil {
			continue // not node-local, or its node is gone
		}
		sn.slices = append(sn.slices, s)
		c.poolNode[s.Spec.Driver+"/"+s.Spec.Pool.Name] = sn
	}
	prev := cache.indexes
	cache.indexes = make(map[string]*deviceIndex, len(c.nodes))
	for _, sn := range c.nodes {
		sort.Slice(sn.slices, func(i, j int) bool { return sn.slices[i].Name < sn.slices[j].Name })
		if ix := prev[sn.node.Name]; ix != nil && slices.Equal(ix.from, sn.slices) {
			sn.deviceIndex = ix
		} else {
			sn.deviceIndex = newDeviceIndex(sn.slices)
		}
		cache.indexes[sn.node.Name] = sn.deviceIndex
	}
	return c
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// nodeOf returns the node an allocation lives on, or nil.
func (c *placer) nodeOf(a *resourceapi.AllocationResult) *placeNode {
	for _, r := range a.Devices.Results {
		if sn := c.poolNode[r.Driver+"/"+r.Pool]; sn != nil {
			return sn
		}
	}
	if a.NodeSelector != nil {
		for _, t := range a.NodeSelector.NodeSelectorTerms {
			for _, f := range t.MatchFields {
				if f.Key == "metadata.name" && len(f.Values) == 1 {
					return c.byName[f.Values[0]]
				}
			}
		}
	}
	return nil
}

func (c *placer) add(sn *placeNode, a *resourceapi.AllocationResult) {
	sn.state.Add(a)
	c.changed(sn, a)
	for _, r := range a.Devices.Results {
		sn.held[structured.MakeDeviceID(r.Driver, r.Pool, r.Device)]++
	}
	sn.version++
}

func (c *placer) remove(sn *placeNode, a *resourceapi.AllocationResult) {
	for _, r := range a.Devices.Results {
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if sn.held[id]--; sn.held[id] <= 0 {
			delete(sn.held, id)
		}
		if r.ShareID == nil {
			sn.state.AllocatedDevices.Delete(id)
			continue
		}
		sn.state.AllocatedSharedDeviceIDs.Delete(structured.MakeSharedDeviceID(id, r.ShareID))
		if r.ConsumedCapacity != nil {
			sn.state.AggregatedCapacity.Remove(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
	c.changed(sn, a)
	sn.version++
}

// allSlices returns the node's slices as the allocator takes them: with
// their devices' attributes (made once per cycle where the cache keeps
// them compact).
func (c *placer) allSlices(sn *placeNode) []*resourceapi.ResourceSlice {
	if sn.withAttrs == nil {
		sn.withAttrs = make([]*resourceapi.ResourceSlice, len(sn.slices))
		for i, s := range sn.slices {
			sn.withAttrs[i] = c.attrs.WithAttributes(s)
		}
	}
	return sn.withAttrs
}

// attributes returns the attributes of the node's device at pos.
func (c *placer) attributes(sn *placeNode, pos devPos) sliceintern.Attrs {
	return c.attrs.Attributes(sn.slices[pos.slice], pos.device)
}

// allocate runs the scheduler's allocator for claims on one node, over the
// devices the claims can select and those allocated (see shortcuts.go).
func (c *placer) allocate(ctx context.Context, sn *placeNode, claims []*resourceapi.ResourceClaim) ([]resourceapi.AllocationResult, error) {
	if c.knownToFail(sn, claims) {
		c.sharedFailures++
		return nil, nil
	}
	if !c.exact && c.selectorsFail(ctx, sn, claims) {
		// What the allocator reports depends on the order in which it
		// meets the failing devices: only the exact call says.
		c.calls++
		// Its failures are not recorded for knownToFail either.
		return allocation.Allocate(ctx, c.features, sn.state, c.classes, c.allSlices(sn), c.cel, sn.node, claims)
	}
	if res, ok, err := c.allocateLadder(ctx, sn, claims); ok {
		return res, err
	}
	c.calls++
	res, err := allocation.Allocate(ctx, c.features, sn.state, c.classes, c.slicesFor(ctx, sn, claims), c.cel, sn.node, claims)
	if err == nil && res == nil {
		c.failed(sn, claims)
	}
	return res, err
}

// fits says whether the pod may run on the node apart from devices:
// usable, node selector and required affinity, taints tolerated, and none
// of ext (the extended resources it gets through DRA) served there by a
// device plugin: kube-scheduler hands those out from the node's
// allocatable instead, outside any claim, so a DRA placement there would
// be charged for devices the pod does not get.
func (c *placer) fits(pod *corev1.Pod, sig string, sn *placeNode, ext []corev1.ResourceName) bool {
	if !sn.usable {
		return false
	}
	if sig == "" && sn.plain {
		return true
	}
	k := filterKey{sn.idx, sig}
	if v, ok := c.fitCache[k]; ok {
		return v
	}
	ok, _ := nodeaffinity.GetRequiredNodeAffinity(pod).Match(sn.node)
	if ok {
		_, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), sn.node.Spec.Taints, pod.Spec.Tolerations, func(t *corev1.Taint) bool {
			return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
		}, true)
		ok = !untolerated
	}
	for _, name := range ext {
		if q, served := sn.node.Status.Allocatable[name]; served && !q.IsZero() {
			ok = false
		}
	}
	c.fitCache[k] = ok
	return ok
}

// podFilterSig fingerprints what restricts a pod's nodes ("" = nothing):
// its selector, affinity and tolerations, and ext (see fits).
func podFilterSig(p *corev1.Pod, ext []corev1.ResourceName) string {
	if len(p.Spec.NodeSelector) == 0 && p.Spec.Affinity == nil && len(p.Spec.Tolerations) == 0 && len(ext) == 0 {
		return ""
	}
	return hashJSON(struct {
		S map[string]string
		A *corev1.Affinity
		T []corev1.Toleration
		E []corev1.ResourceName `json:",omitempty"`
	}{p.Spec.NodeSelector, p.Spec.Affinity, p.Spec.Tolerations, ext})
}

func (c *placer) claimSig(claims []*resourceapi.ResourceClaim) string {
	s := ""
	for _, cl := range claims {
		sig, ok := c.specSigs[cl]
		if !ok {
			h := fnv.New64a()
			h.Write([]byte(c.specJSON(cl)))
			sig = fmt.Sprintf("%x", h.Sum64())
			c.specSigs[cl] = sig
		}
		s += sig + ","
	}
	return s
}

// specJSON is the claim's spec as JSON, once per claim.
func (c *placer) specJSON(cl *resourceapi.ResourceClaim) string {
	j, ok := c.specJSONs[cl]
	if !ok {
		data, _ := json.Marshal(cl.Spec)
		j = string(data)
		c.specJSONs[cl] = j
	}
	return j
}

func hashJSON(v any) string {
	data, _ := json.Marshal(v)
	h := fnv.New64a()
	h.Write(data)
	return fmt.Sprintf("%x", h.Sum64())
}

// placement is where a simulation put one pod's claims.
type placement struct {
	pod     *corev1.Pod
	node    *placeNode
	keys    []string
	results []resourceapi.AllocationResult
}

// trial is an all-or-nothing simulation: placements are applied to the
// node states as they are found and undone by rollback.
type trial struct {
	c *placer
	// hint is tried first (where an earlier admission placed the pod).
	hint   *placeNode
	placed map[string]*placeNode // claim key -> node, within this trial
	done   []placement
}

func (c *placer) newTrial() *trial { return &trial{c: c, placed: map[string]*placeNode{}} }

func (t *trial) rollback() {
	for i := len(t.done) - 1; i >= 0; i-- {
		p := t.done[i]
		for j := range p.results {
			t.c.remove(p.node, &p.results[j])
		}
	}
	t.done = nil
	t.placed = map[string]*placeNode{}
}

// claimInfo is what the trial needs to know about a claim of a pod.
type claimInfo struct {
	pc podclaims.PodClaim
	// node is set when the claim is already allocated or reserved there.
	node *placeNode
	// charged says the claim is accounted elsewhere (allocated, reserved,
	// or charged to another workload) and needs no allocation.
	settled bool
}

// placePod finds a node for the pod's claims that are not settled, first
// fit in node order; claims settled on a node pin the pod to it.
func (t *trial) placePod(ctx context.Context, pod *corev1.Pod, infos []claimInfo) (bool, error) {
	var pin *placeNode
	var toAlloc []*resourceapi.ResourceClaim
	var keys []string
	var ext []corev1.ResourceName
	for _, ci := range infos {
		if strings.HasSuffix(ci.pc.Key, "/"+podclaims.ExtendedClaimEntry) && !ci.pc.Exists {
			ext = t.c.ext.PodExtendedResources(pod)
		}
		n := ci.node
		if sn := t.placed[ci.pc.Key]; sn != nil {
			n = sn
		} else if !ci.settled {
			toAlloc = append(toAlloc, ci.pc.Claim)
			keys = append(keys, ci.pc.Key)
		}
		if n != nil {
			if pin != nil && pin != n {
				return false, nil // claims on two nodes: the pod cannot run
			}
			pin = n
		}
	}
	if pod.Spec.NodeName != "" {
		sn := t.c.byName[pod.Spec.NodeName]
		if sn == nil || (pin != nil && pin != sn) {
			return false, nil
		}
		pin = sn
	}
	if len(toAlloc) == 0 {
		if pin != nil {
			t.done = append(t.done, placement{pod: pod, node: pin})
		}
		return true, nil
	}
	filterSig := podFilterSig(pod, ext)
	sig := t.c.claimSig(toAlloc) + "|" + filterSig
	try := func(sn *placeNode) (bool, error) {
		if !t.c.fits(pod, filterSig, sn, ext) {
			return false, nil
		}
		fk := failKey{sn.idx, sig}
		if v, ok := t.c.fails[fk]; ok && v == sn.version {
			return false, nil
		}
		res, err := t.c.allocate(ctx, sn, toAlloc)
		if err != nil {
			return false, err
		}
		if res == nil {
			t.c.fails[fk] = sn.version
			return false, nil
		}
		for i := range res {
			t.c.add(sn, &res[i])
			t.placed[keys[i]] = sn
		}
		t.done = append(t.done, placement{pod: pod, node: sn, keys: keys, results: res})
		return true, nil
	}
	if pin != nil {
		return try(pin)
	}
	if t.hint != nil {
		if ok, err := try(t.hint); ok || err != nil {
			return ok, err
		}
	}
	for _, sn := range t.c.nodes {
		ok, err := try(sn)
		if ok || err != nil {
			return ok, err
		}
	}
	return false, nil
}

// nodeNames returns the simulated node of every pod placed.
func (t *trial) nodeNames() map[types.UID]string {
	out := map[types.UID]string{}
	for _, p := range t.done {
		out[p.pod.UID] = p.node.node.Name
	}
	return out
}
