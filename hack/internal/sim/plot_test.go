package sim

import (
	"image/png"
	"math"
	"os"
	"path/filepath"
	"testing"

	"gonum.org/v1/plot/plotter"
)

func TestPlotBarsWritesAPNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gpus.png")
	results := []Result{{Policy: WholeGPU, GPUsUsed: 352}, {Policy: Shares, GPUsUsed: 154}}
	if err := PlotBars(path, "GPUs used", "GPUs", "%.0f", results, func(r Result) float64 { return float64(r.GPUsUsed) }); err != nil {
		t.Fatal(err)
	}
	checkPNG(t, path)
}

func TestPlotLinesWritesAPNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bound.png")
	series := []Series{
		{Name: "shares", Points: []plotter.XY{{X: 0, Y: 0}, {X: 1.5, Y: 100}, {X: 4, Y: 200}}},
		{Name: "plain", Points: []plotter.XY{{X: 0, Y: 0}, {X: 1, Y: 200}}},
	}
	if err := PlotLines(path, "Pods bound", "s", "pods", series); err != nil {
		t.Fatal(err)
	}
	checkPNG(t, path)
	if err := PlotLines(path, "bad", "s", "pods", []Series{{Name: "nan", Points: []plotter.XY{{X: math.NaN(), Y: 1}}}}); err == nil {
		t.Error("a series with NaN was plotted; want an error naming it")
	}
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 300 || b.Dy() < 200 {
		t.Fatalf("image is %v, too small to read", b)
	}
}
