package grafana

import (
	"encoding/json"
	"errors"
	"image"
	"image/color"
	"testing"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// statPanel is a stat panel as the dashboards write one: coloured by thresholds.
func statPanel(t *testing.T, colorMode string, steps string) Panel {
	t.Helper()
	var p Panel
	js := `{"type":"stat","title":"t","options":{"colorMode":"` + colorMode + `"},
	  "fieldConfig":{"defaults":{"unit":"s","color":{"mode":"thresholds"},
	  "thresholds":{"mode":"absolute","steps":` + steps + `}}}}`
	if err := json.Unmarshal([]byte(js), &p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestValueColorFollowsSteps(t *testing.T) {
	t.Parallel()
	green, _ := namedColor("green")
	orange, _ := namedColor("orange")
	red, _ := namedColor("red")
	steps := `[{"color":"green","value":null},{"color":"orange","value":10},{"color":"red","value":60}]`
	for _, tc := range []struct {
		name  string
		steps string
		color string // field colour mode
		v     float64
		want  color.RGBA
	}{
		{"below every step", steps, "thresholds", 0.5, green},
		{"at a step's value", steps, "thresholds", 10, orange},
		{"between", steps, "thresholds", 59.9, orange},
		{"stale", steps, "thresholds", 61, red},
		{"negative", steps, "thresholds", -1, green},
		{"hex colour", `[{"color":"green","value":null},{"color":"#102030","value":1}]`, "thresholds", 2,
			color.RGBA{0x10, 0x20, 0x30, 0xff}},
		{"palette mode ignores thresholds", steps, "palette-classic", 61, paletteColor(0)},
		{"unknown colour falls back", `[{"color":"mauve-ish","value":null}]`, "thresholds", 1, paletteColor(0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := statPanel(t, "value", tc.steps)
			p.FieldConfig.Defaults.Color.Mode = tc.color
			if got := valueColor(p, tc.v); got != tc.want {
				t.Errorf("valueColor(%v) = %v, want %v", tc.v, got, tc.want)
			}
		})
	}
}

func TestParseColor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in      string
		want    color.RGBA
		wantErr bool
	}{
		{"red", color.RGBA{0xf2, 0x49, 0x5c, 0xff}, false},
		{"Orange", color.RGBA{0xff, 0x98, 0x30, 0xff}, false},
		{"#ff0000", color.RGBA{0xff, 0, 0, 0xff}, false},
		{"#ff00", color.RGBA{}, true},
		{"#gg0000", color.RGBA{}, true},
		{"", color.RGBA{}, true},
		{"dark-red", color.RGBA{}, true},
	} {
		got, err := parseColor(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("parseColor(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
		if err != nil && !errors.Is(err, ErrDashboard) {
			t.Errorf("parseColor(%q): %v, want ErrDashboard", tc.in, err)
		}
	}
}

// countColor counts the pixels of img exactly c (text keeps its colour inside the
// glyphs; antialiased edges blend).
func countColor(img image.Image, c color.RGBA) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, a := img.At(x, y).RGBA()
			if uint8(r>>8) == c.R && uint8(g>>8) == c.G && uint8(bl>>8) == c.B && uint8(a>>8) == c.A {
				n++
			}
		}
	}
	return n
}

// TestDrawStatIsNotGreenWhenStale draws a stat panel: a value past the red step is
// written in red (no green), one below every step in green; in background mode the
// panel is filled red.
func TestDrawStatIsNotGreenWhenStale(t *testing.T) {
	t.Parallel()
	green, _ := namedColor("green")
	red, _ := namedColor("red")
	steps := `[{"color":"green","value":null},{"color":"red","value":60}]`
	for _, tc := range []struct {
		name      string
		mode      string
		v         float64
		want, not color.RGBA
		minPixels int
	}{
		{"fresh", "value", 2, green, red, 20},
		{"stale", "value", 75, red, green, 20},
		{"stale background", "background", 75, red, green, 5000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			img := vgimg.NewWith(vgimg.UseWH(vg.Length(300)*72/dpi, vg.Length(120)*72/dpi), vgimg.UseDPI(dpi))
			p := statPanel(t, tc.mode, steps)
			drawStat(draw.New(img), p, []renderSeries{{name: "age", t: []float64{1, 2}, v: []float64{1, tc.v}}})
			if n := countColor(img.Image(), tc.want); n < tc.minPixels {
				t.Errorf("%d pixels in %v, want at least %d", n, tc.want, tc.minPixels)
			}
			if n := countColor(img.Image(), tc.not); n != 0 {
				t.Errorf("%d pixels in %v, want none", n, tc.not)
			}
		})
	}
}
