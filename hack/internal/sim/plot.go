package sim

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// PlotBars writes a PNG bar chart of one figure per policy, each bar
// labelled with its value (format, e.g. "%.0f").
func PlotBars(path, title, ylabel, format string, results []Result, value func(Result) float64) error {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	values := make(plotter.Values, len(results))
	names := make([]string, len(results))
	labels := plotter.XYLabels{XYs: make(plotter.XYs, len(results)), Labels: make([]string, len(results))}
	top := 0.0
	for i, r := range results {
		values[i] = value(r)
		names[i] = string(r.Policy)
		top = max(top, values[i])
	}
	for i, v := range values {
		labels.XYs[i] = plotter.XY{X: float64(i), Y: v + top*0.02}
		labels.Labels[i] = fmt.Sprintf(format, v)
	}
	bars, err := plotter.NewBarChart(values, vg.Points(48))
	if err != nil {
		return fmt.Errorf("plot %s: %w", path, err)
	}
	bars.LineStyle.Width = vg.Length(0)
	bars.Color = color.RGBA{R: 0x2b, G: 0x6c, B: 0xb0, A: 0xff}
	lbl, err := plotter.NewLabels(labels)
	if err != nil {
		return fmt.Errorf("plot %s: %w", path, err)
	}
	for i := range lbl.TextStyle {
		lbl.TextStyle[i].XAlign = -0.5
	}
	p.Add(bars, lbl)
	p.Y.Max = top * 1.12
	// Room on both sides for the outer bars' names.
	p.X.Min, p.X.Max = -0.6, float64(len(results))-0.4
	p.NominalX(names...)
	return p.Save(7*vg.Inch, 4*vg.Inch, path)
}

// Series is one line of PlotLines.
type Series struct {
	Name   string
	Points []plotter.XY
}

// PlotLines writes a PNG line chart of the series, with a legend.
func PlotLines(path, title, xlabel, ylabel string, series []Series) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	p.Legend.Left = true
	colors := []color.RGBA{{R: 0x2b, G: 0x6c, B: 0xb0, A: 0xff}, {R: 0xd9, G: 0x5f, B: 0x02, A: 0xff}, {R: 0x1b, G: 0x9e, B: 0x77, A: 0xff}, {R: 0x75, G: 0x70, B: 0xb3, A: 0xff}}
	for i, s := range series {
		line, err := plotter.NewLine(plotter.XYs(s.Points))
		if err != nil {
			return fmt.Errorf("plot %s: %s: %w", path, s.Name, err)
		}
		line.Color = colors[i%len(colors)]
		line.Width = vg.Points(2)
		p.Add(line)
		p.Legend.Add(s.Name, line)
	}
	p.Add(plotter.NewGrid())
	return p.Save(7*vg.Inch, 4*vg.Inch, path)
}
