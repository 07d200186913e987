package sim

import (
	"fmt"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// PlotBars writes a PNG bar chart of one figure per policy.
func PlotBars(path, title, ylabel string, results []Result, value func(Result) float64) error {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	values := make(plotter.Values, len(results))
	names := make([]string, len(results))
	for i, r := range results {
		values[i] = value(r)
		names[i] = string(r.Policy)
	}
	bars, err := plotter.NewBarChart(values, vg.Points(40))
	if err != nil {
		return fmt.Errorf("plot %s: %w", path, err)
	}
	bars.LineStyle.Width = vg.Length(0)
	p.Add(bars)
	p.NominalX(names...)
	return p.Save(7*vg.Inch, 4*vg.Inch, path)
}
