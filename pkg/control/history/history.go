// Package history keeps a queue's usage history: GPU-hours and GPU memory
// GiB-hours, allocated and used, per namespace and GPU model, cumulative,
// exponentially decayed and in daily buckets. It lives in the Queue's
// status (v1alpha1.QueueUsage), so that a restarted controller or a new
// leader continues from it: the amounts are integrated from LastUpdated
// with the rates recorded then (piecewise constant), for at most MaxGap
// of a longer gap (nobody knows what happened while no controller ran);
// the decay runs over the whole gap.
package history

import (
	"math"
	"sort"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// Config is the controller's history settings.
type Config struct {
	// HalfLife of the decayed amounts (--usage-half-life).
	HalfLife time.Duration
	// MaxGap caps how long the last rates are integrated over when
	// updates stopped (--usage-max-gap).
	MaxGap time.Duration
	// Days is how many UTC days of daily buckets are kept, today included
	// (--usage-history-days); 0 keeps none.
	Days int
}

// Key names a record.
type Key struct{ Namespace, Model string }

// Amounts are GPU-hours and GiB-hours (or, as a rate, GPUs and GiB).
type Amounts struct {
	AllocGPU, UsedGPU, AllocMem, UsedMem float64
}

// Add returns a+b.
func (a Amounts) Add(b Amounts) Amounts {
	return Amounts{a.AllocGPU + b.AllocGPU, a.UsedGPU + b.UsedGPU, a.AllocMem + b.AllocMem, a.UsedMem + b.UsedMem}
}

// Scale returns a*f.
func (a Amounts) Scale(f float64) Amounts {
	return Amounts{a.AllocGPU * f, a.UsedGPU * f, a.AllocMem * f, a.UsedMem * f}
}

// Waste is what was allocated and not used.
func (a Amounts) Waste() Amounts {
	return Amounts{AllocGPU: max(a.AllocGPU-a.UsedGPU, 0), AllocMem: max(a.AllocMem-a.UsedMem, 0)}
}

// Record is one namespace's and model's history.
type Record struct {
	Rate, Total, Decayed Amounts
}

// History is one queue's.
type History struct {
	LastUpdated, Since time.Time
	Records            map[Key]*Record
	// Days by date (YYYY-MM-DD, UTC).
	Days map[string]map[Key]Amounts
}

// New starts an empty history at now.
func New(now time.Time) *History {
	return &History{LastUpdated: now, Since: now, Records: map[Key]*Record{}, Days: map[string]map[Key]Amounts{}}
}

// FromStatus continues the history a controller wrote; nil starts a new
// one at now.
func FromStatus(u *v1alpha1.QueueUsage, now time.Time) *History {
	if u == nil || u.LastUpdated.IsZero() {
		return New(now)
	}
	h := New(u.LastUpdated.Time)
	h.Since = u.Since.Time
	if h.Since.IsZero() {
		h.Since = h.LastUpdated
	}
	for _, r := range u.Records {
		h.Records[Key{r.Namespace, r.Model}] = &Record{Rate: ParseRate(r.Rate), Total: ParseAmounts(r.Total), Decayed: ParseAmounts(r.Decayed)}
	}
	for _, d := range u.Days {
		m := map[Key]Amounts{}
		for _, r := range d.Records {
			m[Key{r.Namespace, r.Model}] = ParseAmounts(r.UsageAmounts)
		}
		h.Days[d.Date] = m
	}
	return h
}

// Advance integrates the recorded rates from LastUpdated to now (at most
// cfg.MaxGap of it, from its start) and decays over all of it. A clock
// that went backwards changes nothing.
func (h *History) Advance(now time.Time, cfg Config) {
	gap := now.Sub(h.LastUpdated)
	if gap <= 0 {
		return
	}
	run := gap
	if cfg.MaxGap > 0 && run > cfg.MaxGap {
		run = cfg.MaxGap
	}
	hours := run.Hours()
	lambda := 0.0 // per hour
	if cfg.HalfLife > 0 {
		lambda = math.Ln2 / cfg.HalfLife.Hours()
	}
	for _, r := range h.Records {
		r.Total = r.Total.Add(r.Rate.Scale(hours))
		if lambda == 0 {
			r.Decayed = r.Decayed.Add(r.Rate.Scale(hours))
			continue
		}
		// Exact for a constant rate: D(t+g) = D(t)e^{-λg} + r(1-e^{-λg})/λ,
		// then decay over the rest of the gap, where nothing is known.
		r.Decayed = r.Decayed.Scale(math.Exp(-lambda * hours)).Add(r.Rate.Scale(-math.Expm1(-lambda*hours) / lambda))
		r.Decayed = r.Decayed.Scale(math.Exp(-lambda * (gap - run).Hours()))
	}
	// Daily buckets: split the integrated run at UTC midnights.
	if cfg.Days > 0 {
		from, to := h.LastUpdated.UTC(), h.LastUpdated.Add(run).UTC()
		for from.Before(to) {
			midnight := time.Date(from.Year(), from.Month(), from.Day()+1, 0, 0, 0, 0, time.UTC)
			end := to
			if midnight.Before(end) {
				end = midnight
			}
			date := from.Format(time.DateOnly)
			day := h.Days[date]
			for k, r := range h.Records {
				if r.Rate == (Amounts{}) {
					continue
				}
				if day == nil {
					day = map[Key]Amounts{}
					h.Days[date] = day
				}
				day[k] = day[k].Add(r.Rate.Scale(end.Sub(from).Hours()))
			}
			from = end
		}
	}
	h.LastUpdated = now
	h.prune(now, cfg)
}

// prune drops days older than cfg.Days and records with nothing left.
func (h *History) prune(now time.Time, cfg Config) {
	oldest := now.UTC().AddDate(0, 0, -(cfg.Days - 1)).Format(time.DateOnly)
	for d := range h.Days {
		if cfg.Days <= 0 || d < oldest {
			delete(h.Days, d)
		}
	}
	for k, r := range h.Records {
		if r.Rate == (Amounts{}) && r.Total == (Amounts{}) && r.Decayed == (Amounts{}) {
			delete(h.Records, k)
		}
	}
}

// SetRates records what is held and used now (GPUs and GiB per key);
// keys not in rates hold nothing from now on.
func (h *History) SetRates(rates map[Key]Amounts) {
	for _, r := range h.Records {
		r.Rate = Amounts{}
	}
	for k, v := range rates {
		r := h.Records[k]
		if r == nil {
			r = &Record{}
			h.Records[k] = r
		}
		r.Rate = v
	}
}

// Update is Advance then SetRates.
func (h *History) Update(now time.Time, rates map[Key]Amounts, cfg Config) {
	h.Advance(now, cfg)
	h.SetRates(rates)
}

// Totals sums the records: cumulative and decayed.
func (h *History) Totals() (total, decayed Amounts) {
	for _, r := range h.Records {
		total = total.Add(r.Total)
		decayed = decayed.Add(r.Decayed)
	}
	return total, decayed
}

// ByNamespace sums the records per namespace (over models).
func (h *History) ByNamespace() map[string]Record {
	out := map[string]Record{}
	for k, r := range h.Records {
		s := out[k.Namespace]
		s.Rate, s.Total, s.Decayed = s.Rate.Add(r.Rate), s.Total.Add(r.Total), s.Decayed.Add(r.Decayed)
		out[k.Namespace] = s
	}
	return out
}

// ToStatus writes the history for Queue.status.usage, records and days in
// a stable order so that an unchanged history writes the same object.
func (h *History) ToStatus(cfg Config) *v1alpha1.QueueUsage {
	total, decayed := h.Totals()
	u := &v1alpha1.QueueUsage{
		LastUpdated:  metav1.NewTime(h.LastUpdated.UTC().Truncate(time.Second)),
		Since:        metav1.NewTime(h.Since.UTC().Truncate(time.Second)),
		HalfLife:     metav1.Duration{Duration: cfg.HalfLife},
		RetainedDays: int32(max(cfg.Days, 0)),
		Total:        FormatAmounts(total),
		Decayed:      FormatAmounts(decayed),
	}
	for _, k := range sortedKeys(h.Records) {
		r := h.Records[k]
		u.Records = append(u.Records, v1alpha1.UsageRecord{Namespace: k.Namespace, Model: k.Model, Rate: FormatRate(r.Rate), Total: FormatAmounts(r.Total), Decayed: FormatAmounts(r.Decayed)})
	}
	var dates []string
	for d := range h.Days {
		dates = append(dates, d)
	}
	sort.Strings(dates)
	for _, d := range dates {
		day := v1alpha1.UsageDay{Date: d}
		for _, k := range sortedKeys(h.Days[d]) {
			day.Records = append(day.Records, v1alpha1.UsageDayRecord{Namespace: k.Namespace, Model: k.Model, UsageAmounts: FormatAmounts(h.Days[d][k])})
		}
		u.Days = append(u.Days, day)
	}
	return u
}

func sortedKeys[V any](m map[Key]V) []Key {
	keys := make([]Key, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Namespace != keys[j].Namespace {
			return keys[i].Namespace < keys[j].Namespace
		}
		return keys[i].Model < keys[j].Model
	})
	return keys
}

// FormatDecimal writes v with at most 6 decimals; "" for 0 (omitted).
func FormatDecimal(v float64) v1alpha1.Decimal {
	v = math.Round(v*1e6) / 1e6
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return ""
	}
	return v1alpha1.Decimal(strconv.FormatFloat(v, 'f', -1, 64))
}

// ParseDecimal reads a Decimal; "" and garbage are 0.
func ParseDecimal(d v1alpha1.Decimal) float64 {
	v, err := strconv.ParseFloat(string(d), 64)
	if err != nil || v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// FormatAmounts and ParseAmounts convert amounts.
func FormatAmounts(a Amounts) v1alpha1.UsageAmounts {
	return v1alpha1.UsageAmounts{AllocatedGPUHours: FormatDecimal(a.AllocGPU), UsedGPUHours: FormatDecimal(a.UsedGPU),
		AllocatedMemoryGiBHours: FormatDecimal(a.AllocMem), UsedMemoryGiBHours: FormatDecimal(a.UsedMem)}
}

// ParseAmounts reads amounts.
func ParseAmounts(a v1alpha1.UsageAmounts) Amounts {
	return Amounts{ParseDecimal(a.AllocatedGPUHours), ParseDecimal(a.UsedGPUHours), ParseDecimal(a.AllocatedMemoryGiBHours), ParseDecimal(a.UsedMemoryGiBHours)}
}

// FormatRate and ParseRate convert rates.
func FormatRate(a Amounts) v1alpha1.UsageRate {
	return v1alpha1.UsageRate{AllocatedGPUs: FormatDecimal(a.AllocGPU), UsedGPUs: FormatDecimal(a.UsedGPU),
		AllocatedMemoryGiB: FormatDecimal(a.AllocMem), UsedMemoryGiB: FormatDecimal(a.UsedMem)}
}

// ParseRate reads a rate.
func ParseRate(a v1alpha1.UsageRate) Amounts {
	return Amounts{ParseDecimal(a.AllocatedGPUs), ParseDecimal(a.UsedGPUs), ParseDecimal(a.AllocatedMemoryGiB), ParseDecimal(a.UsedMemoryGiB)}
}

// Window sums the daily buckets of the dates from since (its UTC day,
// whole) on, per key; covered says whether the buckets reach back that far.
func Window(u *v1alpha1.QueueUsage, since time.Time) (sums map[Key]Amounts, covered bool) {
	sums = map[Key]Amounts{}
	if u == nil {
		return sums, false
	}
	first := since.UTC().Format(time.DateOnly)
	for _, d := range u.Days {
		if d.Date < first {
			continue
		}
		for _, r := range d.Records {
			k := Key{r.Namespace, r.Model}
			sums[k] = sums[k].Add(ParseAmounts(r.UsageAmounts))
		}
	}
	// Covered when the history started by then and the buckets kept
	// reach back to that day.
	oldest := u.LastUpdated.UTC().AddDate(0, 0, -int(u.RetainedDays-1)).Format(time.DateOnly)
	covered = !u.Since.IsZero() && !u.Since.After(since) && u.RetainedDays > 0 && oldest <= first
	return sums, covered
}
