package contract

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParseGPUDevices(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want []int // nil: refused
	}{
		{"0", []int{0}}, {"1,3", []int{1, 3}}, {" 2 , 5 ", []int{2, 5}}, {"63", []int{63}},
		{"10,2", []int{10, 2}}, {"007", []int{7}}, {"0,1,2,3,4,5,6,7", []int{0, 1, 2, 3, 4, 5, 6, 7}},
		{"", nil}, {" ", nil}, {",", nil}, {"1,", nil}, {",1", nil}, {"1,,2", nil}, {"64", nil}, {"100", nil},
		{"0007", nil}, {"-1", nil}, {"+1", nil}, {"1.0", nil}, {"0x1", nil}, {"1 2", nil}, {"1,1", nil}, {"a", nil},
		{"GPU-8a6f3b5e-1c2d-4e5f-8a9b-0c1d2e3f4a5b", nil}, {"\u0661", nil}, {strings.Repeat(" ", 510) + "1,2", nil},
	}
	for _, tc := range tests {
		got, err := ParseGPUDevices(tc.in)
		switch {
		case tc.want == nil && (err == nil || !errors.Is(err, ErrInvalidGPUDevices)):
			t.Errorf("ParseGPUDevices(%q) = %v, %v; want ErrInvalidGPUDevices", tc.in, got, err)
		case tc.want != nil && (err != nil || !slices.Equal(got, tc.want)):
			t.Errorf("ParseGPUDevices(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// FuzzParseGPUDevices: whatever it accepts is distinct indices in range, which
// FormatGPUDevices renders into a value that reads back the same.
func FuzzParseGPUDevices(f *testing.F) {
	for _, s := range []string{"0", "1,3", " 2 , 5 ", "63", "64", "+1", "1,1", "", "007"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		devs, err := ParseGPUDevices(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidGPUDevices) {
				t.Fatalf("%q: error %v wraps no sentinel", s, err)
			}
			return
		}
		if len(devs) == 0 || len(devs) > MaxGPUsPerNode {
			t.Fatalf("%q: %d devices", s, len(devs))
		}
		for i, d := range devs {
			if d < 0 || d >= MaxGPUsPerNode || slices.Contains(devs[:i], d) {
				t.Fatalf("%q: device %d out of range or twice in %v", s, d, devs)
			}
		}
		back, err := ParseGPUDevices(FormatGPUDevices(devs))
		if err != nil || !slices.Equal(back, devs) {
			t.Fatalf("%q: %v rendered as %q reads back as %v, %v", s, devs, FormatGPUDevices(devs), back, err)
		}
	})
}
