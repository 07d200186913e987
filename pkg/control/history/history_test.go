package history

import (
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2025, 3, 10, 22, 0, 0, 0, time.UTC)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-4*max(1, math.Abs(b)) }

func nearAmounts(a, b Amounts) bool {
	return near(a.AllocGPU, b.AllocGPU) && near(a.UsedGPU, b.UsedGPU) && near(a.AllocMem, b.AllocMem) && near(a.UsedMem, b.UsedMem)
}

type step struct {
	at    time.Duration // after t0
	rates map[Key]Amounts
}

var (
	nsA = Key{"team-a", "NVIDIA H100"}
	nsB = Key{"team-b", "Tesla T4"}
)

func TestHistory(t *testing.T) {
	noDecay := Config{MaxGap: time.Hour, Days: 7}
	tests := []struct {
		name        string
		cfg         Config
		steps       []step
		total       Amounts
		decayed     Amounts
		byNamespace map[string]Amounts // totals
		days        map[string]Amounts // per date, all keys
	}{
		{
			name: "constant rate accumulates, no decay",
			cfg:  noDecay,
			steps: []step{
				{0, map[Key]Amounts{nsA: {AllocGPU: 1, UsedGPU: 0.25, AllocMem: 80, UsedMem: 20}}},
				{30 * time.Minute, map[Key]Amounts{nsA: {AllocGPU: 1, UsedGPU: 0.25, AllocMem: 80, UsedMem: 20}}},
				{time.Hour, nil},
			},
			total:       Amounts{1, 0.25, 80, 20},
			decayed:     Amounts{1, 0.25, 80, 20},
			byNamespace: map[string]Amounts{"team-a": {1, 0.25, 80, 20}},
		},
		{
			name: "the rate in force until a change is integrated, not the new one",
			cfg:  noDecay,
			steps: []step{
				{0, map[Key]Amounts{nsA: {AllocGPU: 2}}},
				{time.Hour, map[Key]Amounts{nsA: {AllocGPU: 0.5}, nsB: {AllocGPU: 1}}},
				{2 * time.Hour, nil},
			},
			total:       Amounts{AllocGPU: 3.5},
			decayed:     Amounts{AllocGPU: 3.5},
			byNamespace: map[string]Amounts{"team-a": {AllocGPU: 2.5}, "team-b": {AllocGPU: 1}},
		},
		{
			name: "decay: usage one half-life ago counts half",
			cfg:  Config{HalfLife: time.Hour, MaxGap: 24 * time.Hour, Days: 7},
			steps: []step{
				{0, map[Key]Amounts{nsA: {AllocGPU: 1}}},
				{time.Hour, nil},
				{2 * time.Hour, nil},
			},
			total: Amounts{AllocGPU: 1},
			// Integral of e^{-λ(2h-t)} over [0,1h] with λ = ln2/h:
			// (1/λ)(e^{-λ} - e^{-2λ}) = (1/ln2)(1/2 - 1/4).
			decayed:     Amounts{AllocGPU: 0.25 / math.Ln2},
			byNamespace: map[string]Amounts{"team-a": {AllocGPU: 1}},
		},
		{
			name: "decay: a steady rate tends to rate x half-life / ln 2",
			cfg:  Config{HalfLife: time.Hour, MaxGap: 24 * time.Hour},
			steps: []step{
				{0, map[Key]Amounts{nsA: {AllocGPU: 1}}},
				{10 * time.Hour, map[Key]Amounts{nsA: {AllocGPU: 1}}},
				{20 * time.Hour, map[Key]Amounts{nsA: {AllocGPU: 1}}},
			},
			total:   Amounts{AllocGPU: 20},
			decayed: Amounts{AllocGPU: (1 - math.Pow(2, -20)) / math.Ln2},
		},
		{
			name: "a gap longer than the cap integrates only the cap",
			cfg:  Config{MaxGap: 10 * time.Minute, Days: 7},
			steps: []step{
				{0, map[Key]Amounts{nsA: {AllocGPU: 6}}},
				{5 * time.Hour, nil},
			},
			total:   Amounts{AllocGPU: 1},
			decayed: Amounts{AllocGPU: 1},
		},
		{
			name: "daily buckets split at UTC midnight",
			cfg:  Config{MaxGap: 24 * time.Hour, Days: 7},
			steps: []step{
				{0, map[Key]Amounts{nsA: {AllocGPU: 1}, nsB: {AllocMem: 16}}},
				{3 * time.Hour, nil}, // 22:00 to 01:00
			},
			total:   Amounts{AllocGPU: 3, AllocMem: 48},
			decayed: Amounts{AllocGPU: 3, AllocMem: 48},
			days: map[string]Amounts{
				"2025-03-10": {AllocGPU: 2, AllocMem: 32},
				"2025-03-11": {AllocGPU: 1, AllocMem: 16},
			},
		},
		{
			name: "days older than the retention are dropped",
			cfg:  Config{MaxGap: 48 * time.Hour, Days: 1},
			steps: []step{
				{0, map[Key]Amounts{nsA: {AllocGPU: 1}}},
				{27 * time.Hour, nil}, // to 01:00 on the 12th
			},
			total:   Amounts{AllocGPU: 27},
			decayed: Amounts{AllocGPU: 27},
			days:    map[string]Amounts{"2025-03-12": {AllocGPU: 1}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Every step goes through the status, as with a controller
			// restarted (or a new leader) before each update: the result
			// must be that of one history kept in memory.
			var mem *History
			st := New(t0).ToStatus(tt.cfg)
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				if i == 0 {
					mem = New(now)
				}
				mem.Update(now, s.rates, tt.cfg)
				h := FromStatus(st, now)
				h.Update(now, s.rates, tt.cfg)
				st = h.ToStatus(tt.cfg)
			}
			restored := FromStatus(st, time.Time{})
			for name, h := range map[string]*History{"in memory": mem, "through status": restored} {
				total, decayed := h.Totals()
				if !nearAmounts(total, tt.total) || !nearAmounts(decayed, tt.decayed) {
					t.Errorf("%s: total %+v decayed %+v, want %+v and %+v", name, total, decayed, tt.total, tt.decayed)
				}
				if tt.byNamespace != nil {
					got := h.ByNamespace()
					for ns, want := range tt.byNamespace {
						if !nearAmounts(got[ns].Total, want) {
							t.Errorf("%s: namespace %s total %+v, want %+v", name, ns, got[ns].Total, want)
						}
					}
					if len(got) != len(tt.byNamespace) {
						t.Errorf("%s: namespaces %v, want %v", name, got, tt.byNamespace)
					}
				}
				if tt.days != nil {
					if len(h.Days) != len(tt.days) {
						t.Errorf("%s: days %v, want %v", name, h.Days, tt.days)
					}
					for d, want := range tt.days {
						var sum Amounts
						for _, a := range h.Days[d] {
							sum = sum.Add(a)
						}
						if !nearAmounts(sum, want) {
							t.Errorf("%s: day %s %+v, want %+v", name, d, sum, want)
						}
					}
				}
			}
		})
	}
}

func TestStatusRoundTripAndWindow(t *testing.T) {
	cfg := Config{HalfLife: 24 * time.Hour, MaxGap: 48 * time.Hour, Days: 3}
	h := New(t0)
	h.Update(t0, map[Key]Amounts{nsA: {AllocGPU: 1, UsedGPU: 0.5}, nsB: {AllocMem: 15}}, cfg)
	h.Update(t0.Add(26*time.Hour), map[Key]Amounts{nsA: {AllocGPU: 1, UsedGPU: 0.5}}, cfg)
	st := h.ToStatus(cfg)
	if st.Total.AllocatedGPUHours != "26" || st.Total.AllocatedMemoryGiBHours != "390" || st.RetainedDays != 3 {
		t.Fatalf("status totals %+v retained %d", st.Total, st.RetainedDays)
	}
	// The new rate survives the round trip: a restarted controller goes on
	// integrating it.
	back := FromStatus(st, time.Time{})
	back.Advance(t0.Add(28*time.Hour), cfg)
	if total, _ := back.Totals(); !near(total.AllocGPU, 28) || !near(total.AllocMem, 390) {
		t.Errorf("after restart: %+v", total)
	}
	st = back.ToStatus(cfg)
	tests := []struct {
		since   time.Time
		covered bool
		gpu     float64
	}{
		{t0.Add(26 * time.Hour), true, 2},    // the 12th: 00:00-02:00
		{t0.Add(3 * time.Hour), true, 26},    // the 11th and 12th
		{t0, true, 28},                       // all three days
		{t0.Add(-48 * time.Hour), false, 28}, // before the history
	}
	for _, tt := range tests {
		sums, covered := Window(st, tt.since)
		var sum Amounts
		for _, a := range sums {
			sum = sum.Add(a)
		}
		if covered != tt.covered || !near(sum.AllocGPU, tt.gpu) {
			t.Errorf("since %s: %v covered %v, want %v %v", tt.since, sum.AllocGPU, covered, tt.gpu, tt.covered)
		}
	}
}

func TestDecimal(t *testing.T) {
	for _, tt := range []struct {
		v    float64
		want string
	}{{0, ""}, {-1, ""}, {1.5, "1.5"}, {1.0000004, "1"}, {12345.123456789, "12345.123457"}, {math.NaN(), ""}} {
		if got := FormatDecimal(tt.v); string(got) != tt.want {
			t.Errorf("FormatDecimal(%v) = %q, want %q", tt.v, got, tt.want)
		}
	}
	if ParseDecimal("x") != 0 || ParseDecimal("2.25") != 2.25 {
		t.Error("ParseDecimal")
	}
}
