package grafana

import (
	"fmt"
	"image/color"
	"strconv"
	"strings"
)

// Thresholds are a panel's threshold steps, as Grafana's fieldConfig holds them.
// The first step's value is null (minus infinity); each later step starts at its
// value. Only absolute mode is drawn: percentage thresholds need the field's min and
// max, which these dashboards do not set for their stats.
type Thresholds struct {
	Mode  string          `json:"mode"` // "absolute" or "percentage"
	Steps []ThresholdStep `json:"steps"`
}

// ThresholdStep is one step: a colour from its value up to the next step's.
type ThresholdStep struct {
	Color string   `json:"color"`
	Value *float64 `json:"value"`
}

// FieldColor is the field's colour scheme ("thresholds", "palette-classic", ...).
type FieldColor struct {
	Mode string `json:"mode"`
}

// ThresholdsStyle is how a time series draws its thresholds ("off", "line",
// "dashed", "area", "line+area", "dashed+area").
type ThresholdsStyle struct {
	Mode string `json:"mode"`
}

// PanelOptions are the stat panel options the renderer honours.
type PanelOptions struct {
	// ColorMode is "value" (the number in its threshold colour; Grafana's default),
	// "background" (the panel filled with it) or "none".
	ColorMode string `json:"colorMode"`
}

// namedColor is a Grafana colour name the dashboards use, in the main shade of
// Grafana's palette.
func namedColor(name string) (color.RGBA, bool) {
	switch strings.ToLower(name) {
	case "green":
		return color.RGBA{0x73, 0xbf, 0x69, 0xff}, true
	case "orange":
		return color.RGBA{0xff, 0x98, 0x30, 0xff}, true
	case "red":
		return color.RGBA{0xf2, 0x49, 0x5c, 0xff}, true
	case "yellow":
		return color.RGBA{0xfa, 0xde, 0x2a, 0xff}, true
	case "blue":
		return color.RGBA{0x57, 0x94, 0xf2, 0xff}, true
	case "purple":
		return color.RGBA{0xb8, 0x77, 0xd9, 0xff}, true
	case "text":
		return color.RGBA{0x20, 0x20, 0x20, 0xff}, true
	}
	return color.RGBA{}, false
}

// parseColor reads a Grafana colour: a name namedColor knows, or #rrggbb.
func parseColor(s string) (color.RGBA, error) {
	if c, ok := namedColor(s); ok {
		return c, nil
	}
	if h, ok := strings.CutPrefix(s, "#"); ok && len(h) == 6 {
		n, err := strconv.ParseUint(h, 16, 32)
		if err == nil {
			return color.RGBA{uint8(n >> 16), uint8(n >> 8), uint8(n), 0xff}, nil
		}
	}
	return color.RGBA{}, fmt.Errorf("%w: colour %q (want a name or #rrggbb)", ErrDashboard, s)
}

// stepColor is the colour of the step v falls in: the last step whose value is at
// most v (the first step, null, takes everything below the second).
func (th Thresholds) stepColor(v float64) (color.RGBA, error) {
	name := ""
	for _, s := range th.Steps {
		if s.Value == nil || v >= *s.Value {
			name = s.Color
		}
	}
	if name == "" {
		c, _ := namedColor("green")
		return c, nil
	}
	return parseColor(name)
}

// lines are the steps drawn as lines on a time series: each with a value.
func (th Thresholds) lines() []ThresholdStep {
	var out []ThresholdStep
	for _, s := range th.Steps {
		if s.Value != nil {
			out = append(out, s)
		}
	}
	return out
}

// valueColor is the colour a stat panel writes value v in: its threshold step's
// when the field is coloured by thresholds (Grafana's default for stats), else
// Grafana's first palette colour.
func valueColor(p Panel, v float64) color.RGBA {
	fd := p.FieldConfig.Defaults
	if (fd.Color.Mode == "" || fd.Color.Mode == "thresholds") && fd.Thresholds.Mode != "percentage" &&
		len(fd.Thresholds.Steps) > 0 {
		if c, err := fd.Thresholds.stepColor(v); err == nil {
			return c
		}
	}
	return paletteColor(0)
}
