package sim

import (
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

func TestPlotBarsWritesAPNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gpus.png")
	results := []Result{{Policy: WholeGPU, GPUsUsed: 352}, {Policy: Shares, GPUsUsed: 154}}
	if err := PlotBars(path, "GPUs used", "GPUs", "%.0f", results, func(r Result) float64 { return float64(r.GPUsUsed) }); err != nil {
		t.Fatal(err)
	}
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
