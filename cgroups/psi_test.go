package cgroups

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParsePSI(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   string
		want PSI
		ok   bool
	}{
		{"cgroup cpu.pressure", "some avg10=1.50 avg60=0.75 avg300=0.25 total=123456\nfull avg10=0.50 avg60=0.25 avg300=0.05 total=6543\n",
			PSI{Some: PSILine{1.5, 0.75, 0.25, 123456 * time.Microsecond}, Full: PSILine{0.5, 0.25, 0.05, 6543 * time.Microsecond}}, true},
		{"old kernel cpu: no full", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", PSI{}, true},
		{"no trailing newline", "some avg10=100.00 avg60=0.00 avg300=0.00 total=1", PSI{Some: PSILine{Avg10: 100, Total: time.Microsecond}}, true},
		{"field order and extra fields", "some total=2 avg300=0.01 avg60=0.02 avg10=0.03 future=7\n", PSI{Some: PSILine{0.03, 0.02, 0.01, 2 * time.Microsecond}}, true},
		{"empty", "", PSI{}, false},
		{"only full", "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", PSI{}, false},
		{"repeated some", "some avg10=0 avg60=0 avg300=0 total=0\nsome avg10=0 avg60=0 avg300=0 total=0\n", PSI{}, false},
		{"repeated full", "some avg10=0 avg60=0 avg300=0 total=0\nfull avg10=0 avg60=0 avg300=0 total=0\nfull avg10=0 avg60=0 avg300=0 total=0\n", PSI{}, false},
		{"missing total", "some avg10=0.00 avg60=0.00 avg300=0.00\n", PSI{}, false},
		{"missing avg60", "some avg10=0.00 avg300=0.00 total=0\n", PSI{}, false},
		{"repeated field", "some avg10=0 avg10=0 avg60=0 avg300=0 total=0\n", PSI{}, false},
		{"bare word", "some avg10 avg60=0 avg300=0 total=0\n", PSI{}, false},
		{"unknown kind", "most avg10=0 avg60=0 avg300=0 total=0\n", PSI{}, false},
		{"negative avg", "some avg10=-1 avg60=0 avg300=0 total=0\n", PSI{}, false},
		{"avg over 100", "some avg10=100.01 avg60=0 avg300=0 total=0\n", PSI{}, false},
		{"NaN", "some avg10=NaN avg60=0 avg300=0 total=0\n", PSI{}, false},
		{"Inf", "some avg10=Inf avg60=0 avg300=0 total=0\n", PSI{}, false},
		{"negative total", "some avg10=0 avg60=0 avg300=0 total=-1\n", PSI{}, false},
		{"total overflows Duration", "some avg10=0 avg60=0 avg300=0 total=18446744073709551615\n", PSI{}, false},
		{"too long", "some avg10=0 avg60=0 avg300=0 total=0 " + strings.Repeat("x=1 ", 2000) + "\n", PSI{}, false},
	} {
		got, err := ParsePSI(strings.NewReader(tc.in))
		if tc.ok != (err == nil) || got != tc.want {
			t.Errorf("%s: ParsePSI = %+v, %v; want %+v ok=%v", tc.name, got, err, tc.want, tc.ok)
		}
		if !tc.ok && !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: error %v does not wrap ErrMalformed", tc.name, err)
		}
	}
}

func TestPressureFake(t *testing.T) {
	t.Parallel()
	want := PSI{Some: PSILine{1.5, 0.75, 0.25, 123456 * time.Microsecond}, Full: PSILine{0.5, 0.25, 0.05, 6543 * time.Microsecond}}
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			h := OpenLayout(newFake(t, k), k.layout())
			g := fakeCreate(t, h, "kubepods/besteffort/understory-batch")
			got, err := g.Pressure()
			if k.layout() == LayoutV1 {
				if !errors.Is(err, ErrUnsupported) {
					t.Fatalf("v1 Pressure = %v; want ErrUnsupported", err)
				}
				return
			}
			if err != nil || got != want {
				t.Fatalf("Pressure = %+v, %v; want %+v", got, err, want)
			}
			if k.layout() == LayoutHybrid && g.unifiedDir() != filepath.Join(h.Root(), "unified", g.Path()) {
				t.Fatalf("hybrid pressure read from %s", g.unifiedDir())
			}
			mustWrite(t, filepath.Join(g.unifiedDir(), "cpu.pressure"), "some avg10=x\n")
			if _, err := g.Pressure(); !errors.Is(err, ErrMalformed) {
				t.Fatalf("Pressure on garbage = %v; want ErrMalformed", err)
			}
		})
	}
}
