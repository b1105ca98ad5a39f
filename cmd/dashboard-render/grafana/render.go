package grafana

import (
	"cmp"
	"context"
	"fmt"
	"image/color"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// RenderOptions size a rendering.
type RenderOptions struct {
	// Window is the time range, the step and the variables, as for Check.
	Window Window
	// Width is the image's width in pixels (default 1800): 24 grid columns.
	Width int
	// RowHeight is the height of one grid row in pixels (default 30, as Grafana).
	RowHeight int
}

// dpi of the rendered PNG; sizes below are in pixels, gonum draws in points.
const dpi = 96

func px(n float64) vg.Length { return vg.Length(n * 72 / dpi) }

// Render draws d as Grafana lays it out on its 24-column grid: each time-series
// panel a plot of its targets' series over the window (stacked where the panel
// stacks), each stat panel its last value, each row its title; queries go to
// Prometheus' range and instant APIs with the variables expanded as Check does. It
// writes a PNG to w. A panel whose query fails or returns nothing says so in its
// place: rendering never hides a broken panel.
func Render(ctx context.Context, api API, d Dashboard, o RenderOptions, w io.Writer) error {
	win, err := o.Window.withDefaults()
	if err != nil {
		return err
	}
	width := float64(cmp.Or(o.Width, 1800))
	rowH := float64(cmp.Or(o.RowHeight, 30))
	const header = 44.0
	bottom := 0
	for _, p := range d.Panels {
		bottom = max(bottom, p.GridPos.Y+p.GridPos.H)
	}
	height := header + float64(bottom)*rowH + 8
	img := vgimg.NewWith(vgimg.UseWH(px(width), px(height)), vgimg.UseDPI(dpi),
		vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	title := textStyle(18, color.Black)
	dc.FillText(title, vg.Point{X: px(12), Y: px(height - 30)}, fmt.Sprintf("%s — %s to %s", d.Title,
		win.Start.Local().Format("2006-01-02 15:04:05"), win.End.Local().Format("15:04:05 MST")))
	vals := win.values(d)
	colW := width / 24
	for _, p := range d.Panels {
		// Grafana's y grows downwards; gonum's upwards from the bottom.
		x0 := float64(p.GridPos.X) * colW
		y1 := height - header - float64(p.GridPos.Y)*rowH
		rect := vg.Rectangle{
			Min: vg.Point{X: px(x0 + 4), Y: px(y1 - float64(p.GridPos.H)*rowH + 4)},
			Max: vg.Point{X: px(x0 + float64(p.GridPos.W)*colW - 4), Y: px(y1 - 4)},
		}
		c := draw.Canvas{Canvas: img, Rectangle: rect}
		switch p.Type {
		case "row":
			c.FillText(textStyle(13, color.Gray{Y: 40}), vg.Point{X: rect.Min.X, Y: rect.Min.Y + px(6)}, p.Title)
			c.StrokeLine2(draw.LineStyle{Color: color.Gray{Y: 200}, Width: px(1)}, rect.Min.X, rect.Min.Y+px(2),
				rect.Max.X, rect.Min.Y+px(2))
			continue
		case "text":
			continue
		}
		frame(c)
		p.Title = displayTitle(p.Title, d, vals)
		series, err := panelSeries(ctx, api, p, vals, win)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			message(c, p.Title, err.Error())
			continue
		}
		if p.Type == "stat" || p.Type == "gauge" || p.Type == "bargauge" {
			drawStat(c, p, series)
			continue
		}
		if err := drawTimeSeries(c, p, series, win); err != nil {
			message(c, p.Title, err.Error())
		}
	}
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

// displayTitle expands the variables of a panel title (a repeated panel's "$node")
// as Grafana shows them: a regex standing for every value reads "All".
func displayTitle(title string, d Dashboard, vals map[string]string) string {
	shown := map[string]string{}
	for k, v := range vals {
		shown[k] = v
	}
	for _, v := range d.Templating.List {
		if x := shown[v.Name]; x == ".*" || x == ".+" || (v.IncludeAll && x == v.AllValue) {
			shown[v.Name] = "All"
		}
	}
	if t, err := Expand(title, shown); err == nil {
		return t
	}
	return title
}

// renderSeries is one series of a panel, named by its target's legend format.
type renderSeries struct {
	name    string
	t, v    []float64 // unix seconds, values (NaN where missing)
	stacked bool
}

// panelSeries runs the panel's targets over the window.
func panelSeries(ctx context.Context, api API, p Panel, vals map[string]string, w Window) ([]renderSeries, error) {
	var out []renderSeries
	unstacked := unstackedMatchers(p)
	stacking := p.FieldConfig.Defaults.Custom.Stacking.Mode == "normal"
	for _, t := range p.Targets {
		if t.Hide {
			continue
		}
		expr, err := Expand(t.Expr, vals)
		if err != nil {
			return nil, err
		}
		var val model.Value
		if t.IsInstant() {
			val, _, _, err = api.Query(ctx, expr, w.End)
		} else {
			val, _, _, err = api.QueryRange(ctx, expr, v1.Range{Start: w.Start, End: w.End, Step: w.Step})
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.RefID, err)
		}
		add := func(m model.Metric, ts, vs []float64) {
			name := legend(t.LegendFormat, m)
			st := stacking
			for _, re := range unstacked {
				if re.MatchString(name) {
					st = false
				}
			}
			out = append(out, renderSeries{name: name, t: ts, v: vs, stacked: st})
		}
		switch v := val.(type) {
		case model.Matrix:
			for _, s := range v {
				ts := make([]float64, len(s.Values))
				vs := make([]float64, len(s.Values))
				for i, pt := range s.Values {
					ts[i], vs[i] = float64(pt.Timestamp)/1000, float64(pt.Value)
				}
				add(s.Metric, ts, vs)
			}
		case model.Vector:
			for _, s := range v {
				add(s.Metric, []float64{float64(s.Timestamp) / 1000}, []float64{float64(s.Value)})
			}
		case *model.Scalar:
			add(model.Metric{}, []float64{float64(v.Timestamp) / 1000}, []float64{float64(v.Value)})
		}
	}
	return out, nil
}

// unstackedMatchers returns the regexps of overrides that turn stacking off (the
// dashboards' dashed reference lines: budget, capacity, installed).
func unstackedMatchers(p Panel) []*regexp.Regexp {
	var out []*regexp.Regexp
	for _, o := range p.FieldConfig.Overrides {
		s, _ := o.Matcher.Options.(string)
		var pattern string
		switch o.Matcher.ID {
		case "byRegexp":
			pattern = "^(?:" + s + ")$"
		case "byName":
			pattern = "^" + regexp.QuoteMeta(s) + "$"
		default:
			continue
		}
		for _, prop := range o.Properties {
			if prop.ID == "custom.stacking" && strings.Contains(string(prop.Value), `"none"`) {
				if re, err := regexp.Compile(pattern); err == nil {
					out = append(out, re)
				}
			}
		}
	}
	return out
}

// legendRE matches Grafana's {{label}} in a legend format.
var legendRE = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// legend names a series as Grafana would: the legend format with {{label}}
// replaced (a missing label by nothing), else the series' labels.
func legend(format string, m model.Metric) string {
	if format == "" || format == "__auto" {
		if len(m) == 0 {
			return "value"
		}
		return m.String()
	}
	return strings.TrimSpace(legendRE.ReplaceAllStringFunc(format, func(s string) string {
		return string(m[model.LabelName(legendRE.FindStringSubmatch(s)[1])])
	}))
}

// paletteColor is colour i of Grafana's classic palette.
func paletteColor(i int) color.RGBA {
	p := [...]color.RGBA{
		{0x73, 0xbf, 0x69, 0xff}, {0xf2, 0xcc, 0x0c, 0xff}, {0x8a, 0xb8, 0xff, 0xff}, {0xff, 0x78, 0x0a, 0xff},
		{0xf2, 0x49, 0x5c, 0xff}, {0x56, 0x94, 0xf2, 0xff}, {0xb8, 0x77, 0xd9, 0xff}, {0x70, 0x5d, 0xa0, 0xff},
		{0x37, 0x87, 0x2d, 0xff}, {0xe0, 0xb4, 0x00, 0xff}, {0x1f, 0x60, 0xc4, 0xff}, {0xc4, 0x16, 0x2a, 0xff},
	}
	return p[i%len(p)]
}

func textStyle(size float64, c color.Color) draw.TextStyle {
	return draw.TextStyle{Color: c, Font: font.From(plot.DefaultFont, px(size)), Handler: plot.DefaultTextHandler}
}

func frame(c draw.Canvas) {
	r := c.Rectangle
	c.StrokeLines(draw.LineStyle{Color: color.Gray{Y: 215}, Width: px(1)}, []vg.Point{
		r.Min, {X: r.Max.X, Y: r.Min.Y}, r.Max, {X: r.Min.X, Y: r.Max.Y}, r.Min})
}

// message writes a panel's title and a note (no data, an error) in its place.
func message(c draw.Canvas, title, note string) {
	r := c.Rectangle
	c.FillText(textStyle(12, color.Black), vg.Point{X: r.Min.X + px(6), Y: r.Max.Y - px(16)}, title)
	st := textStyle(12, color.RGBA{0xc4, 0x16, 0x2a, 0xff})
	st.XAlign, st.YAlign = draw.XCenter, draw.YCenter
	if len(note) > 120 {
		note = note[:117] + "..."
	}
	c.FillText(st, vg.Point{X: (r.Min.X + r.Max.X) / 2, Y: (r.Min.Y + r.Max.Y) / 2}, note)
}

// lastFinite returns the series' last finite value.
func lastFinite(s renderSeries) (float64, bool) {
	for i := len(s.v) - 1; i >= 0; i-- {
		if !math.IsNaN(s.v[i]) && !math.IsInf(s.v[i], 0) {
			return s.v[i], true
		}
	}
	return 0, false
}

// drawStat writes each series' last value, large, as a stat panel shows it: in its
// threshold colour (colorMode "value", the default), or white on a panel filled with
// the colour of the worst value (colorMode "background"), so that a stale or broken
// value never reads green.
func drawStat(c draw.Canvas, p Panel, series []renderSeries) {
	type shown struct {
		text string
		col  color.RGBA
		v    float64
	}
	var vals []shown
	for _, s := range series {
		if v, ok := lastFinite(s); ok {
			if d := p.FieldConfig.Defaults.Decimals; d != nil {
				p10 := math.Pow(10, float64(*d))
				v = math.Round(v*p10) / p10
			}
			vals = append(vals, shown{formatUnit(v, p.FieldConfig.Defaults.Unit), valueColor(p, v), v})
		}
	}
	if len(vals) == 0 {
		message(c, p.Title, "No data")
		return
	}
	r := c.Rectangle
	titleCol := color.Color(color.Black)
	if p.Options.ColorMode == "background" {
		worst := vals[0]
		for _, v := range vals[1:] {
			if stepIndex(p, v.v) > stepIndex(p, worst.v) {
				worst = v
			}
		}
		c.SetColor(worst.col)
		c.Fill(rectPath(r))
		titleCol = color.White
		for i := range vals {
			vals[i].col = color.RGBA{0xff, 0xff, 0xff, 0xff}
		}
	}
	if p.Options.ColorMode == "none" {
		for i := range vals {
			vals[i].col = color.RGBA{0x20, 0x20, 0x20, 0xff}
		}
	}
	c.FillText(textStyle(12, titleCol), vg.Point{X: r.Min.X + px(6), Y: r.Max.Y - px(16)}, p.Title)
	const gap = "  "
	st := textStyle(26, color.Black)
	total := st.Width(gap) * vg.Length(len(vals)-1)
	for _, v := range vals {
		total += st.Width(v.text)
	}
	x := (r.Min.X+r.Max.X)/2 - total/2
	for _, v := range vals {
		st.Color = v.col
		st.YAlign = draw.YCenter
		c.FillText(st, vg.Point{X: x, Y: (r.Min.Y+r.Max.Y)/2 - px(6)}, v.text)
		x += st.Width(v.text) + st.Width(gap)
	}
}

// stepIndex is the index of the threshold step v falls in (0 without thresholds).
func stepIndex(p Panel, v float64) int {
	i := 0
	for k, s := range p.FieldConfig.Defaults.Thresholds.Steps {
		if s.Value == nil || v >= *s.Value {
			i = k
		}
	}
	return i
}

func rectPath(r vg.Rectangle) vg.Path {
	var pa vg.Path
	pa.Move(r.Min)
	pa.Line(vg.Point{X: r.Max.X, Y: r.Min.Y})
	pa.Line(r.Max)
	pa.Line(vg.Point{X: r.Min.X, Y: r.Max.Y})
	pa.Close()
	return pa
}

// drawTimeSeries plots the series (stacked ones cumulated in query order, filled)
// over the window, with the legend below the plot as Grafana places it.
func drawTimeSeries(c draw.Canvas, p Panel, series []renderSeries, w Window) error {
	type entry struct {
		name  string
		color color.Color
		dash  bool
		zero  bool
	}
	var entries []entry
	var lines []plot.Plotter
	var stackBase map[float64]float64
	finiteAny := false
	// Stacked series first (drawn top of the stack first, so lower fills cover
	// higher ones), then the others over them.
	type drawn struct {
		pts   []plotter.XYs
		color color.Color
		fill  bool
		dash  bool
	}
	var stack, plain []drawn
	for i, s := range series {
		col := paletteColor(i)
		var segs []plotter.XYs
		var seg plotter.XYs
		for k := range s.t {
			v := s.v[k]
			ok := !math.IsNaN(v) && !math.IsInf(v, 0)
			// A series absent for a while has no points there (Prometheus returns none,
			// not NaN): a gap of more than a step ends the segment, as Grafana draws it.
			if k > 0 && s.t[k]-s.t[k-1] > 1.5*w.Step.Seconds() && len(seg) > 0 {
				segs, seg = append(segs, seg), nil
			}
			if ok && s.stacked {
				if stackBase == nil {
					stackBase = map[float64]float64{}
				}
				stackBase[s.t[k]] += v
				v = stackBase[s.t[k]]
			}
			if !ok {
				if len(seg) > 0 {
					segs, seg = append(segs, seg), nil
				}
				continue
			}
			finiteAny = true
			seg = append(seg, plotter.XY{X: s.t[k], Y: v})
		}
		if len(seg) > 0 {
			segs = append(segs, seg)
		}
		if len(segs) == 0 {
			continue
		}
		d := drawn{pts: segs, color: col, fill: s.stacked, dash: !s.stacked && stackBase != nil}
		if s.stacked {
			stack = append(stack, d)
		} else {
			plain = append(plain, d)
		}
		entries = append(entries, entry{name: s.name, color: col, dash: d.dash, zero: allZero(s)})
	}
	// A crowded legend leaves out the series that stayed at 0 (e.g. every eviction
	// reason and result that never happened); they are still drawn.
	if len(entries) > 6 {
		entries = slices.DeleteFunc(entries, func(e entry) bool { return e.zero })
	}
	if !finiteAny {
		message(c, p.Title, "No data")
		return nil
	}
	slices.Reverse(stack)
	for _, d := range append(stack, plain...) {
		for _, pts := range d.pts {
			if len(pts) == 1 { // a lone point: a short tick, so it shows
				pts = append(pts, plotter.XY{X: pts[0].X + w.Step.Seconds()/2, Y: pts[0].Y})
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				return err
			}
			l.LineStyle = draw.LineStyle{Color: d.color, Width: px(1.5)}
			if d.dash {
				l.LineStyle.Dashes = []vg.Length{px(6), px(4)}
				l.LineStyle.Width = px(2)
			}
			if d.fill {
				r, g, b, _ := d.color.RGBA()
				l.FillColor = color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8), 0xff}
			}
			lines = append(lines, l)
		}
	}

	// The legend: entries flow left to right below the plot, at most legendRows rows.
	const legendRows = 3
	legendStyle := textStyle(10, color.Gray{Y: 50})
	r := c.Rectangle
	var rows [][]entry
	var rowW vg.Length
	for _, e := range entries {
		ew := legendStyle.Width(e.name) + px(24)
		if len(rows) == 0 || rowW+ew > r.Max.X-r.Min.X-px(12) {
			if len(rows) == legendRows {
				break
			}
			rows, rowW = append(rows, nil), 0
		}
		rows[len(rows)-1] = append(rows[len(rows)-1], e)
		rowW += ew
	}
	lineH := px(14)
	legendH := vg.Length(len(rows))*lineH + px(4)
	for i, row := range rows {
		x := r.Min.X + px(8)
		y := r.Min.Y + legendH - vg.Length(i+1)*lineH + px(2)
		for _, e := range row {
			ls := draw.LineStyle{Color: e.color, Width: px(3)}
			if e.dash {
				ls.Dashes = []vg.Length{px(3), px(2)}
			}
			c.StrokeLine2(ls, x, y+px(5), x+px(14), y+px(5))
			c.FillText(legendStyle, vg.Point{X: x + px(18), Y: y}, e.name)
			x += legendStyle.Width(e.name) + px(24)
		}
	}
	if shown := countEntries(rows); shown < len(entries) {
		st := legendStyle
		st.XAlign = draw.XRight
		c.FillText(st, vg.Point{X: r.Max.X - px(6), Y: r.Min.Y + px(2)},
			fmt.Sprintf("+%d more", len(entries)-shown))
	}

	pl := plot.New()
	pl.Title.Text = p.Title
	pl.Title.TextStyle = textStyle(12, color.Black)
	pl.Title.TextStyle.XAlign = draw.XLeft
	pl.Title.Padding = px(4)
	pl.X.Tick.Marker = plot.TimeTicks{Format: "15:04:05", Time: func(t float64) time.Time {
		return time.Unix(int64(t), 0).Local()
	}}
	pl.X.Tick.Label.Font.Size = px(9)
	pl.Y.Tick.Label.Font.Size = px(9)
	pl.Y.Tick.Marker = unitTicks{unit: p.FieldConfig.Defaults.Unit}
	pl.Y.Label.Text = p.FieldConfig.Defaults.Custom.AxisLabel
	pl.Y.Label.TextStyle.Font.Size = px(10)
	pl.Add(plotter.NewGrid())
	pl.Add(lines...)
	pl.X.Min, pl.X.Max = float64(w.Start.Unix()), float64(w.End.Unix())
	if m := p.FieldConfig.Defaults.Min; m != nil {
		pl.Y.Min = *m
	}
	if m := p.FieldConfig.Defaults.Max; m != nil && pl.Y.Max <= *m {
		pl.Y.Max = *m
	}
	if pl.Y.Max <= pl.Y.Min {
		pl.Y.Max = pl.Y.Min + 1
	}
	// Thresholds as Grafana draws them (thresholdsStyle line or dashed): a
	// horizontal line in the step's colour, where it falls inside the axis (they do
	// not stretch it).
	if mode := p.FieldConfig.Defaults.Custom.ThresholdsStyle.Mode; mode != "" && mode != "off" && mode != "area" {
		for _, s := range p.FieldConfig.Defaults.Thresholds.lines() {
			v := *s.Value
			if v < pl.Y.Min || v > pl.Y.Max {
				continue
			}
			col, err := parseColor(s.Color)
			if err != nil {
				return err
			}
			l, err := plotter.NewLine(plotter.XYs{{X: pl.X.Min, Y: v}, {X: pl.X.Max, Y: v}})
			if err != nil {
				return err
			}
			l.LineStyle = draw.LineStyle{Color: col, Width: px(1.5)}
			if strings.HasPrefix(mode, "dashed") {
				l.LineStyle.Dashes = []vg.Length{px(8), px(4)}
			}
			pl.Add(l)
		}
	}
	pl.Draw(draw.Canvas{Canvas: c.Canvas, Rectangle: vg.Rectangle{
		Min: vg.Point{X: r.Min.X + px(2), Y: r.Min.Y + legendH + px(2)},
		Max: vg.Point{X: r.Max.X - px(8), Y: r.Max.Y - px(2)}}})
	return nil
}

// allZero reports whether every finite value of s is 0.
func allZero(s renderSeries) bool {
	for _, v := range s.v {
		if v != 0 && !math.IsNaN(v) {
			return false
		}
	}
	return true
}

func countEntries[E any](rows [][]E) int {
	n := 0
	for _, r := range rows {
		n += len(r)
	}
	return n
}

// unitTicks labels an axis' ticks in a Grafana unit.
type unitTicks struct{ unit string }

func (u unitTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = formatUnit(ts[i].Value, u.unit)
		}
	}
	return ts
}

// formatUnit writes v in a Grafana unit (the ones the dashboards use).
func formatUnit(v float64, unit string) string {
	num := func(x float64) string {
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	round := func(x float64) float64 {
		if x == 0 || math.IsNaN(x) || math.IsInf(x, 0) {
			return x
		}
		p := math.Pow(10, 3-math.Ceil(math.Log10(math.Abs(x))))
		return math.Round(x*p) / p
	}
	switch unit {
	case "percentunit":
		return num(round(v*100)) + "%"
	case "bytes":
		units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
		i := 0
		for math.Abs(v) >= 1024 && i < len(units)-1 {
			v /= 1024
			i++
		}
		return num(round(v)) + " " + units[i]
	case "s":
		switch a := math.Abs(v); {
		case a == 0:
			return "0"
		case a < 1e-3:
			return num(round(v*1e6)) + " µs"
		case a < 1:
			return num(round(v*1e3)) + " ms"
		}
		return num(round(v)) + " s"
	case "ops":
		return num(round(v)) + "/s"
	case "reqps":
		return num(round(v)) + " req/s"
	}
	switch a := math.Abs(v); {
	case a >= 1e9:
		return num(round(v/1e9)) + "G"
	case a >= 1e6:
		return num(round(v/1e6)) + "M"
	case a >= 1e4:
		return num(round(v/1e3)) + "k"
	}
	return num(round(v))
}
