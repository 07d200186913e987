package sim

import (
	"encoding/csv"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
)

// Job is one pod of a trace: what it asks for and what it really uses.
type Job struct {
	Name string
	Kind string
	// Request is the GPU memory the pod declares (bytes).
	Request uint64
	// Usage is the GPU memory it actually touches (bytes).
	Usage uint64
}

const gib = 1 << 30
const mib = 1 << 20

// Showdown is the seeds' "scheduler showdown": four pods on one 16 GB T4.
func Showdown() []Job {
	return []Job{
		{Name: "inference-1", Kind: "inference", Request: 2000 * mib, Usage: 2000 * mib},
		{Name: "inference-2", Kind: "inference", Request: 2000 * mib, Usage: 2000 * mib},
		{Name: "training", Kind: "training", Request: 8000 * mib, Usage: 8000 * mib},
		{Name: "preprocessing", Kind: "preprocessing", Request: 3000 * mib, Usage: 3000 * mib},
	}
}

// MixSpec is one kind of job in a generated trace.
type MixSpec struct {
	Kind     string
	Weight   float64
	MinGiB   float64
	MaxGiB   float64
	OverLow  float64
	OverHigh float64
}

// DefaultMix is the distribution of the mixed trace: requests uniform in
// [MinGiB, MaxGiB] (rounded to 256 MiB), and pods over-request by a factor
// uniform in [OverLow, OverHigh] (usage = request / factor), the 3-4x the
// seeds report.
var DefaultMix = []MixSpec{
	{Kind: "inference", Weight: 0.55, MinGiB: 1, MaxGiB: 8, OverLow: 3, OverHigh: 4},
	{Kind: "training", Weight: 0.25, MinGiB: 8, MaxGiB: 40, OverLow: 3, OverHigh: 4},
	{Kind: "notebook", Weight: 0.20, MinGiB: 2, MaxGiB: 12, OverLow: 3, OverHigh: 4},
}

// Generate draws n jobs from mix with a fixed seed (reproducible).
func Generate(n int, seed uint64, mix []MixSpec) []Job {
	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
	var total float64
	for _, m := range mix {
		total += m.Weight
	}
	jobs := make([]Job, 0, n)
	for i := range n {
		x := r.Float64() * total
		m := mix[len(mix)-1]
		for _, c := range mix {
			if x < c.Weight {
				m = c
				break
			}
			x -= c.Weight
		}
		reqGiB := m.MinGiB + r.Float64()*(m.MaxGiB-m.MinGiB)
		req := uint64(reqGiB*4+0.5) * (gib / 4)
		over := m.OverLow + r.Float64()*(m.OverHigh-m.OverLow)
		jobs = append(jobs, Job{Name: fmt.Sprintf("%s-%04d", m.Kind, i), Kind: m.Kind, Request: req, Usage: uint64(float64(req) / over)})
	}
	return jobs
}

// WriteCSV writes a trace as name,kind,requestMiB,usageMiB.
func WriteCSV(w io.Writer, jobs []Job) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"name", "kind", "requestMiB", "usageMiB"})
	for _, j := range jobs {
		_ = cw.Write([]string{j.Name, j.Kind, strconv.FormatUint(j.Request/mib, 10), strconv.FormatUint(j.Usage/mib, 10)})
	}
	cw.Flush()
	return cw.Error()
}

// ReadCSV reads a trace written by WriteCSV.
func ReadCSV(path string) ([]Job, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	var jobs []Job
	for i, row := range rows {
		if i == 0 {
			continue
		}
		if len(row) != 4 {
			return nil, fmt.Errorf("trace %s line %d: want name,kind,requestMiB,usageMiB", path, i+1)
		}
		req, err1 := strconv.ParseUint(row[2], 10, 64)
		use, err2 := strconv.ParseUint(row[3], 10, 64)
		if err1 != nil || err2 != nil || req == 0 {
			return nil, fmt.Errorf("trace %s line %d: requestMiB and usageMiB must be positive integers", path, i+1)
		}
		jobs = append(jobs, Job{Name: row[0], Kind: row[1], Request: req * mib, Usage: use * mib})
	}
	return jobs, nil
}

// Filter returns the jobs of one kind.
func Filter(jobs []Job, kind string) []Job {
	var out []Job
	for _, j := range jobs {
		if j.Kind == kind {
			out = append(out, j)
		}
	}
	return out
}
