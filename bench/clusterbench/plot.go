package clusterbench

import (
	"fmt"
	"image/color"
	"io"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Plot draws the report as a PNG: left, the cluster's CPU utilisation over the
// measured part with and without co-location, one pair of lines per size; right,
// the costs against nodes (API requests/s, agents' Node writes/s, extender filter
// p99 ms).
func Plot(r Report, w io.Writer) error {
	left := plot.New()
	left.Title.Text = "Cluster CPU utilisation (%)"
	left.X.Label.Text = "seconds into the measured part"
	left.Y.Min, left.Y.Max = 0, 100
	for i, s := range r.Sizes {
		with, without := make(plotter.XYs, len(s.Series)), make(plotter.XYs, len(s.Series))
		for k, p := range s.Series {
			with[k] = plotter.XY{X: p.T, Y: 100 * p.With}
			without[k] = plotter.XY{X: p.T, Y: 100 * p.Without}
		}
		c := palette(i)
		for _, l := range []struct {
			xy    plotter.XYs
			label string
			dash  bool
		}{{with, fmt.Sprintf("%d nodes, co-located", s.Nodes), false}, {without, fmt.Sprintf("%d nodes, LS only", s.Nodes), true}} {
			if len(l.xy) == 0 {
				continue
			}
			ln, err := plotter.NewLine(l.xy)
			if err != nil {
				return fmt.Errorf("plot: %w", err)
			}
			ln.Color = c
			if l.dash {
				ln.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			}
			left.Add(ln)
			left.Legend.Add(l.label, ln)
		}
	}
	left.Legend.Top = true
	right := plot.New()
	right.Title.Text = "Costs against nodes"
	right.X.Label.Text = "nodes"
	for i, c := range []struct {
		name string
		get  func(SizeResult) float64
	}{
		{"API requests/s ÷ 10", func(s SizeResult) float64 { return s.APIRequestsPerSec / 10 }},
		{"agents' Node writes/s", func(s SizeResult) float64 { return s.AgentNodeWritesPerSec }},
		{"extender filter p99 (ms)", func(s SizeResult) float64 { return s.ExtenderFilterP99Ms }},
		{"extender RSS (MiB) ÷ 10", func(s SizeResult) float64 { return s.ExtenderRSSMiB / 10 }},
	} {
		xy := make(plotter.XYs, len(r.Sizes))
		for k, s := range r.Sizes {
			xy[k] = plotter.XY{X: float64(s.Nodes), Y: c.get(s)}
		}
		lp, pts, err := plotter.NewLinePoints(xy)
		if err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		lp.Color, pts.Color = palette(i), palette(i)
		right.Add(lp, pts)
		right.Legend.Add(c.name, lp, pts)
	}
	right.Legend.Top, right.Legend.Left = true, true
	img := vgimg.New(14*vg.Inch, 5*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 2,
		PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2}
	canvases := plot.Align([][]*plot.Plot{{left, right}}, tiles, dc)
	left.Draw(canvases[0][0])
	right.Draw(canvases[0][1])
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("writing png: %w", err)
	}
	return nil
}

func palette(i int) color.RGBA {
	p := []color.RGBA{{31, 119, 180, 255}, {214, 39, 40, 255}, {44, 160, 44, 255}, {255, 127, 14, 255},
		{148, 103, 189, 255}, {140, 86, 75, 255}}
	return p[i%len(p)]
}
