package decide

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"

	"github.com/tessera-dev/tessera/pkg/control/sliceintern"
)

// CEL results of the placement shortcuts (shortcut 1 in shortcuts.go):
// per expression and device content, shared by identical devices.

// deviceContentKey identifies what CEL sees of a device.
func deviceContentKey(driver string, d *resourceapi.Device, attrs sliceintern.Attrs) string {
	var b strings.Builder
	b.WriteString(driver)
	if d.AllowMultipleAllocations != nil {
		b.WriteString("|m" + strconv.FormatBool(*d.AllowMultipleAllocations))
	}
	names := make([]string, 0, attrs.Len())
	for n := range attrs.All() {
		names = append(names, string(n))
	}
	slices.Sort(names)
	for _, n := range names {
		a, _ := attrs.Get(resourceapi.QualifiedName(n))
		b.WriteString("|a" + n + "=")
		switch {
		case a.IntValue != nil:
			b.WriteString("i" + strconv.FormatInt(*a.IntValue, 10))
		case a.BoolValue != nil:
			b.WriteString("b" + strconv.FormatBool(*a.BoolValue))
		case a.StringValue != nil:
			b.WriteString("s" + strconv.Quote(*a.StringValue))
		case a.VersionValue != nil:
			b.WriteString("v" + strconv.Quote(*a.VersionValue))
		default:
			data, _ := json.Marshal(a)
			b.Write(data)
		}
	}
	names = names[:0]
	for n := range d.Capacity {
		names = append(names, string(n))
	}
	slices.Sort(names)
	for _, n := range names {
		c := d.Capacity[resourceapi.QualifiedName(n)]
		b.WriteString("|c" + n + "=" + c.Value.String())
	}
	return b.String()
}

// exprResults are a CEL expression's results per distinct key of what it
// reads of a device (celRefs.appendKey, or '*' and the device's whole
// content): the keys of its refs' signature, numbered (placeCache.keys).
type exprResults struct {
	refs celRefs
	sig  string
	// results by key number: 0 not evaluated yet, 1 no match, 2 match.
	results []int8
}

// expr returns the expression's results.
func (p *placer) expr(expr string) *exprResults {
	e := p.cache.exprs[expr]
	if e == nil {
		e = &exprResults{refs: analyzeCEL(expr)}
		e.sig = e.refs.sig()
		p.cache.exprs[expr] = e
	}
	return e
}

// keyIDs numbers the node's devices (flat, in slice order) by their keys
// under the signature of e's refs, once per node and signature: the MIG
// selectors of a claim's alternatives all read the same capacity, so they
// share one pass.
func (p *placer) keyIDs(sn *placeNode, e *exprResults) []int32 {
	if ids, ok := sn.keyIDs[e.sig]; ok {
		return ids
	}
	p.nodeIndex(sn)
	space := p.cache.keys[e.sig]
	if space == nil {
		space = map[string]int32{}
		p.cache.keys[e.sig] = space
	}
	ids := make([]int32, 0, sn.devices)
	for i, s := range sn.slices {
		for j := range s.Spec.Devices {
			d := &s.Spec.Devices[j]
			if e.refs.fixed && p.convertible(sn, devPos{i, j}) {
				p.keyBuf = e.refs.appendKey(p.keyBuf[:0], s.Spec.Driver, d, p.attributes(sn, devPos{i, j}))
			} else {
				p.keyBuf = append(append(p.keyBuf[:0], '*'), deviceContentKey(s.Spec.Driver, d, p.attributes(sn, devPos{i, j}))...)
			}
			id, ok := space[string(p.keyBuf)]
			if !ok {
				id = int32(len(space))
				space[string(p.keyBuf)] = id
			}
			ids = append(ids, id)
		}
	}
	sn.keyIDs[e.sig] = ids
	p.cache.entries++
	return ids
}

// matches says whether the expression selects the node's device at pos.
// An expression that does not compile or fails at run time on the device
// selects nothing (as for kube-scheduler, whose allocator reports the
// error and never allocates the device): shortcuts never run for claims
// whose selectors fail on a node (selectorsFail), the exact allocator
// call reports the error instead.
func (p *placer) matches(ctx context.Context, expr string, sn *placeNode, pos devPos) bool {
	e := p.expr(expr)
	return p.result(ctx, expr, e, p.keyIDs(sn, e)[sn.offsets[pos.slice]+pos.device], sn, pos) == celMatch
}

// CEL results as exprResults keeps them.
const (
	celUnknown int8 = iota
	celNoMatch
	celMatch
	celError
)

// result is e's result for key id, evaluated on the node's device at pos
// (which has that key) when not known yet: celMatch, celNoMatch or
// celError (the expression does not compile or fails on the device).
func (p *placer) result(ctx context.Context, expr string, e *exprResults, id int32, sn *placeNode, pos devPos) int8 {
	if n := int(id) + 1; n > len(e.results) {
		e.results = append(e.results, make([]int8, n-len(e.results))...)
	}
	if r := e.results[id]; r != celUnknown {
		return r
	}
	p.celEvaluations++
	s := sn.slices[pos.slice]
	d := &s.Spec.Devices[pos.device]
	r := celError
	if res := p.cel.GetOrCompile(expr); res.Error == nil {
		m, _, err := res.DeviceMatches(ctx, cel.Device{Driver: s.Spec.Driver, AllowMultipleAllocations: d.AllowMultipleAllocations, Attributes: p.attributes(sn, pos).Map(), Capacity: d.Capacity})
		switch {
		case err != nil:
			r = celError
		case m:
			r = celMatch
		default:
			r = celNoMatch
		}
	}
	e.results[id] = r
	return r
}

// convertible says whether CEL can take every attribute of the node's
// device at pos, computed once.
func (p *placer) convertible(sn *placeNode, pos devPos) bool {
	p.nodeIndex(sn)
	if sn.convertible == nil {
		sn.convertible = make([]int8, sn.devices)
	}
	k := sn.flat(pos)
	if sn.convertible[k] == 0 {
		sn.convertible[k] = 1
		if deviceConvertible(p.attributes(sn, pos), p.cache.versions.ok) {
			sn.convertible[k] = 2
		}
	}
	return sn.convertible[k] == 2
}

// selects says, for every device of the node in the allocator's order,
// whether the expression selects it; once per node and expression, so
// alternatives of the same class share the class's selectors.
func (p *placer) selects(ctx context.Context, sn *placeNode, expr string) []bool {
	if v, ok := sn.vectors[expr]; ok {
		return v
	}
	e := p.expr(expr)
	ids := p.keyIDs(sn, e)
	v := make([]bool, len(ids))
	for i, s := range sn.slices {
		for j := range s.Spec.Devices {
			k := sn.offsets[i] + j
			switch p.result(ctx, expr, e, ids[k], sn, devPos{i, j}) {
			case celMatch:
				v[k] = true
			case celError:
				sn.failing[expr] = true
			}
		}
	}
	sn.vectors[expr] = v
	p.cache.entries++
	return v
}
