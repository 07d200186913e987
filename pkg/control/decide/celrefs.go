package decide

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/blang/semver/v4"
	"github.com/google/cel-go/common"
	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/parser"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/control/sliceintern"
)

// celRefs are the parts of a device a CEL selector reads, when it reads
// only named parts: device.driver, device.allowMultipleAllocations and
// device.attributes[<domain>].<name> or device.capacity[<domain>].<name>
// with constant domains and names (by field or index, optional or not, or
// in has()). Its result then depends on those parts alone, so devices that
// agree on them share one evaluation: MIG devices of a model differ in
// UUIDs and placements, not in the type and memory that selectors ask
// about.
type celRefs struct {
	// fixed says whether the expression reads named parts only; if not,
	// the whole device content decides (deviceContentKey).
	fixed       bool
	attrs, caps []domainName
}

// domainName is a device part by domain and name, with its qualified
// spelling.
type domainName struct {
	domain, name string
	q            resourceapi.QualifiedName
}

func newDomainName(domain, name string) domainName {
	return domainName{domain, name, resourceapi.QualifiedName(domain + "/" + name)}
}

// qualified are the spellings of the name on a device of the driver: an
// unqualified name belongs to the driver's domain, so both count there.
func (dn domainName) qualified(driver string) (resourceapi.QualifiedName, resourceapi.QualifiedName, bool) {
	return dn.q, resourceapi.QualifiedName(dn.name), dn.domain == driver
}

// analyzeCEL finds what the expression reads of the device. Anything it
// does not recognise (a parse error, the device or one of its maps used as
// a whole, a computed key) makes the result depend on the whole content.
func analyzeCEL(expr string) celRefs {
	p, err := parser.NewParser(parser.Macros(parser.AllMacros...), parser.EnableOptionalSyntax(true))
	if err != nil {
		return celRefs{}
	}
	tree, errs := p.Parse(common.NewTextSource(expr))
	if len(errs.GetErrors()) > 0 {
		return celRefs{}
	}
	r := celRefs{fixed: true}
	r.fixed = r.walk(tree.Expr())
	return r
}

// walk records the device parts e reads; false if it reads the device
// otherwise.
func (r *celRefs) walk(e ast.Expr) bool {
	if done, ok := r.devicePart(e); done {
		return ok
	}
	switch e.Kind() {
	case ast.IdentKind:
		return e.AsIdent() != "device"
	case ast.SelectKind:
		return r.walk(e.AsSelect().Operand())
	case ast.CallKind:
		c := e.AsCall()
		if c.IsMemberFunction() && !r.walk(c.Target()) {
			return false
		}
		for _, a := range c.Args() {
			if !r.walk(a) {
				return false
			}
		}
	case ast.ListKind:
		for _, el := range e.AsList().Elements() {
			if !r.walk(el) {
				return false
			}
		}
	case ast.MapKind:
		for _, en := range e.AsMap().Entries() {
			m := en.AsMapEntry()
			if !r.walk(m.Key()) || !r.walk(m.Value()) {
				return false
			}
		}
	case ast.StructKind:
		for _, f := range e.AsStruct().Fields() {
			if !r.walk(f.AsStructField().Value()) {
				return false
			}
		}
	case ast.ComprehensionKind:
		c := e.AsComprehension()
		for _, x := range []ast.Expr{c.IterRange(), c.AccuInit(), c.LoopCondition(), c.LoopStep(), c.Result()} {
			if !r.walk(x) {
				return false
			}
		}
	}
	return true
}

// devicePart matches e against device.driver,
// device.allowMultipleAllocations and device.<map>[<domain>].<name>;
// done says whether e is rooted at the device at all (ok: recognised).
func (r *celRefs) devicePart(e ast.Expr) (done, ok bool) {
	operand, field, isAccess := access(e)
	if !isAccess {
		return false, false
	}
	if isDevice(operand) {
		// device.driver or device.allowMultipleAllocations; the device's
		// maps as a whole are not recognised.
		return true, field == "driver" || field == "allowMultipleAllocations"
	}
	inner, domain, isAccess := access(operand)
	if !isAccess {
		return false, false
	}
	root, m, isAccess := access(inner)
	if !isAccess || !isDevice(root) {
		return false, false
	}
	switch m {
	case "attributes":
		r.attrs = append(r.attrs, newDomainName(domain, field))
	case "capacity":
		r.caps = append(r.caps, newDomainName(domain, field))
	default:
		return true, false
	}
	return true, true
}

func isDevice(e ast.Expr) bool { return e.Kind() == ast.IdentKind && e.AsIdent() == "device" }

// access matches operand.field, operand["field"], operand.?field and
// operand[?"field"] (and has(operand.field)).
func access(e ast.Expr) (operand ast.Expr, field string, ok bool) {
	switch e.Kind() {
	case ast.SelectKind:
		s := e.AsSelect()
		return s.Operand(), s.FieldName(), true
	case ast.CallKind:
		c := e.AsCall()
		switch c.FunctionName() {
		case operators.Index, operators.OptIndex, operators.OptSelect:
		default:
			return nil, "", false
		}
		if len(c.Args()) != 2 || c.Args()[1].Kind() != ast.LiteralKind {
			return nil, "", false
		}
		s, isString := c.Args()[1].AsLiteral().(types.String)
		if !isString {
			return nil, "", false
		}
		return c.Args()[0], string(s), true
	}
	return nil, "", false
}

// sig names what r reads: expressions of one signature build their keys
// alike, so they share numbered keys (placer.keyIDs).
func (r celRefs) sig() string {
	if !r.fixed {
		return "*"
	}
	var b strings.Builder
	for _, dn := range r.attrs {
		b.WriteString("a" + string(dn.q) + "\x00")
	}
	for _, dn := range r.caps {
		b.WriteString("c" + string(dn.q) + "\x00")
	}
	return b.String()
}

// appendKey appends to dst what the expression reads of the device. The
// caller checks first that the expression is fixed and that CEL can take
// every attribute of the device (convertible); otherwise the whole content
// decides.
func (r celRefs) appendKey(dst []byte, driver string, d *resourceapi.Device, attrs sliceintern.Attrs) []byte {
	dst = appendField(dst, 'd', driver)
	if d.AllowMultipleAllocations != nil {
		dst = strconv.AppendBool(append(dst, 'm'), *d.AllowMultipleAllocations)
	}
	for _, dn := range r.attrs {
		q, bare, both := dn.qualified(driver)
		dst = appendAttribute(dst, attrs, q)
		if both {
			dst = appendAttribute(dst, attrs, bare)
		}
	}
	for _, dn := range r.caps {
		q, bare, both := dn.qualified(driver)
		dst = appendCapacity(dst, d.Capacity, q)
		if both {
			dst = appendCapacity(dst, d.Capacity, bare)
		}
	}
	return dst
}

func appendAttribute(dst []byte, attrs sliceintern.Attrs, n resourceapi.QualifiedName) []byte {
	a, ok := attrs.Get(n)
	switch {
	case !ok:
		return append(dst, '-')
	case a.IntValue != nil:
		return append(strconv.AppendInt(append(dst, 'i'), *a.IntValue, 10), ';')
	case a.BoolValue != nil:
		return strconv.AppendBool(append(dst, 'b'), *a.BoolValue)
	case a.StringValue != nil:
		return appendField(dst, 's', *a.StringValue)
	}
	data, _ := json.Marshal(a)
	return appendField(dst, 'j', string(data))
}

func appendCapacity(dst []byte, caps map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, n resourceapi.QualifiedName) []byte {
	if c, ok := caps[n]; ok {
		return appendField(dst, 'c', c.Value.String())
	}
	return append(dst, '-')
}

// appendField appends a tagged, length-prefixed value, so that keys cannot
// run into each other.
func appendField(dst []byte, tag byte, v string) []byte {
	dst = strconv.AppendInt(append(dst, tag), int64(len(v)), 10)
	return append(append(dst, ':'), v...)
}

// deviceConvertible says whether CEL can take every attribute of the
// device.
func deviceConvertible(attrs sliceintern.Attrs, versionOK func(string) bool) bool {
	for _, a := range attrs.All() {
		if !convertible(a, versionOK) {
			return false
		}
	}
	return true
}

// convertible says whether CEL can take the attribute (the cases of the
// DRA CEL package's attribute conversion).
func convertible(a resourceapi.DeviceAttribute, versionOK func(string) bool) bool {
	switch {
	case a.IntValues != nil || a.BoolValues != nil || a.StringValues != nil:
		return true
	case a.VersionValues != nil:
		for _, v := range a.VersionValues {
			if !versionOK(v) {
				return false
			}
		}
		return true
	case a.IntValue != nil || a.BoolValue != nil || a.StringValue != nil:
		return true
	case a.VersionValue != nil:
		return versionOK(*a.VersionValue)
	}
	return false
}

// versionCache remembers which version strings parse.
type versionCache map[string]bool

func (c versionCache) ok(v string) bool {
	ok, seen := c[v]
	if !seen {
		_, err := semver.Parse(v)
		ok = err == nil
		c[v] = ok
	}
	return ok
}
