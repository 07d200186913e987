// Package queue holds the queue hierarchy and its arithmetic: quotas,
// limits, KAI-style hierarchical fair share (quota first, the rest by
// priority buckets and over-quota weight, capped by limit and demand) and
// the dominant share that orders queues for admission. Everything here is a
// pure function of its inputs; the admission loop feeds it.
package queue

import (
	"fmt"
	"math"
	"math/bits"

	inf "gopkg.in/inf.v0"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// Resource indexes the accounted resources in a Vector.
type Resource int

// The accounted resources.
const (
	Memory Resource = iota
	GPUs
	NumResources
)

// GPU is one GPU equivalent in the units of Vector[GPUs] (micro-GPUs), fine
// enough for 1/N time slices and memory shares of any size.
const GPU = 1_000_000

// Names maps a Resource to its API name.
var Names = [NumResources]v1alpha1.ResourceName{v1alpha1.ResourceGPUMemory, v1alpha1.ResourceGPUs}

// Vector is an amount of every accounted resource: memory in bytes, GPUs in
// micro-GPUs.
type Vector [NumResources]int64

// Add returns v + o, saturating at the int64 bounds instead of wrapping.
func (v Vector) Add(o Vector) Vector {
	for r := range v {
		v[r] = satAdd(v[r], o[r])
	}
	return v
}

// Sub returns v - o, saturating at the int64 bounds instead of wrapping.
func (v Vector) Sub(o Vector) Vector {
	for r := range v {
		v[r] = satSub(v[r], o[r])
	}
	return v
}

// satAdd is a + b clamped to [MinInt64, MaxInt64].
func satAdd(a, b int64) int64 {
	s := a + b
	switch {
	case a > 0 && b > 0 && s < 0:
		return math.MaxInt64
	case a < 0 && b < 0 && s >= 0:
		return math.MinInt64
	}
	return s
}

// satSub is a - b clamped to [MinInt64, MaxInt64].
func satSub(a, b int64) int64 {
	if b == math.MinInt64 {
		return satAdd(satAdd(a, math.MaxInt64), 1)
	}
	return satAdd(a, -b)
}

// SatMul is a * n clamped to [MinInt64, MaxInt64].
func SatMul(a, n int64) int64 {
	if a == 0 || n == 0 {
		return 0
	}
	neg := (a < 0) != (n < 0)
	ua, un := absU(a), absU(n)
	hi, lo := bits.Mul64(ua, un)
	switch {
	case neg && (hi != 0 || lo > 1<<63):
		return math.MinInt64
	case neg:
		return int64(-lo) // lo <= 2^63: -lo wraps to the right value
	case hi != 0 || lo > math.MaxInt64:
		return math.MaxInt64
	}
	return int64(lo)
}

func absU(a int64) uint64 {
	if a < 0 {
		return uint64(-(a + 1)) + 1
	}
	return uint64(a)
}

// IsZero says whether every component is zero.
func (v Vector) IsZero() bool { return v == Vector{} }

// LessEq says whether every component of v is at most o's.
func (v Vector) LessEq(o Vector) bool {
	for r := range v {
		if v[r] > o[r] {
			return false
		}
	}
	return true
}

// Max returns the componentwise maximum.
func (v Vector) Max(o Vector) Vector {
	for r := range v {
		v[r] = max(v[r], o[r])
	}
	return v
}

// String renders the vector for logs and messages.
func (v Vector) String() string {
	return fmt.Sprintf("%s gpu memory, %s GPUs", FormatAmount(Memory, v[Memory]), FormatAmount(GPUs, v[GPUs]))
}

// NoLimit marks an unset limit.
const NoLimit = -1

// Quantity converts an amount to the API's resource.Quantity: memory in
// bytes (BinarySI), GPUs rounded to milli-GPUs.
func Quantity(r Resource, v int64) resource.Quantity {
	if r == GPUs {
		return *resource.NewMilliQuantity((v+500)/1000, resource.DecimalSI)
	}
	return *resource.NewQuantity(v, resource.BinarySI)
}

// FromQuantity converts an API quantity into the units of r, saturating
// at the int64 bounds: a quantity too large for 64 bits (1e30) is the
// largest amount, never 0 or negative (the CRD bounds amounts at 1e18).
func FromQuantity(r Resource, q resource.Quantity) int64 {
	scale := resource.Scale(0)
	if r == GPUs {
		scale = resource.Micro
	}
	// The exact value in units of r: q * 10^-scale.
	d := new(inf.Dec).Mul(q.AsDec(), inf.NewDec(1, inf.Scale(scale)))
	switch {
	case d.Cmp(inf.NewDec(math.MaxInt64, 0)) >= 0:
		return math.MaxInt64
	case d.Cmp(inf.NewDec(math.MinInt64, 0)) <= 0:
		return math.MinInt64
	}
	return q.ScaledValue(scale)
}

// FormatAmount renders an amount the way users write it: memory in the
// largest binary unit that keeps one decimal (8Gi, 1.5Gi, 300Mi), GPUs as
// a decimal number (2, 0.5, 0.333).
func FormatAmount(r Resource, v int64) string {
	if r == GPUs {
		if v%GPU == 0 {
			return fmt.Sprintf("%d", v/GPU)
		}
		s := fmt.Sprintf("%.3f", float64(v)/GPU)
		for s[len(s)-1] == '0' {
			s = s[:len(s)-1]
		}
		return s
	}
	neg := ""
	if v < 0 {
		neg, v = "-", -v
	}
	units := []string{"", "Ki", "Mi", "Gi", "Ti", "Pi"}
	f := float64(v)
	i := 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if f == math.Trunc(f) {
		return fmt.Sprintf("%s%d%s", neg, int64(f), units[i])
	}
	if i == 0 {
		return fmt.Sprintf("%s%d", neg, v)
	}
	return fmt.Sprintf("%s%.1f%s", neg, f, units[i])
}

// HumanName is the resource's name in messages.
func HumanName(r Resource) string {
	if r == GPUs {
		return "GPUs"
	}
	return "gpu memory"
}

// mulDiv returns a*b/c without overflow for non-negative a, b and c > 0;
// the result saturates at MaxInt64.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}
