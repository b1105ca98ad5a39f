package collect

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/understory/understory/cgroups"
)

func TestReadPressure(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeProc(t, root, "pressure/cpu", "some avg10=1.50 avg60=0.41 avg300=0.64 total=5862914\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
	writeProc(t, root, "pressure/memory", "some avg10=0.00 avg60=0.00 avg300=0.00 total=12\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=7\n")
	writeProc(t, root, "pressure/io", "garbage\n")
	noPSIRoot := t.TempDir()

	tests := []struct {
		name     string
		root     string
		resource string
		want     cgroups.PSI
		wantErr  error
	}{
		{
			name: "cpu", root: root, resource: "cpu",
			want: cgroups.PSI{Some: cgroups.PSILine{Avg10: 1.5, Avg60: 0.41, Avg300: 0.64, Total: 5862914 * time.Microsecond}},
		},
		{
			name: "memory", root: root, resource: "memory",
			want: cgroups.PSI{Some: cgroups.PSILine{Total: 12 * time.Microsecond}, Full: cgroups.PSILine{Total: 7 * time.Microsecond}},
		},
		{name: "malformed", root: root, resource: "io", wantErr: cgroups.ErrMalformed},
		{name: "kernel without PSI", root: noPSIRoot, resource: "cpu", wantErr: ErrNoPSI},
		{name: "unknown resource", root: root, resource: "../stat", wantErr: ErrUnknownResource},
		{name: "irq is not supported", root: root, resource: "irq", wantErr: ErrUnknownResource},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ReadPressure(tc.root, tc.resource)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestReadPressureNoPSIKeepsCause(t *testing.T) {
	t.Parallel()
	_, err := ReadPressure(t.TempDir(), "memory")
	if !errors.Is(err, ErrNoPSI) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("err = %v, want ErrNoPSI wrapping ErrNotExist", err)
	}
}

// TestReadPressureRealProc reads this machine's PSI when the kernel has it.
func TestReadPressureRealProc(t *testing.T) {
	t.Parallel()
	for _, res := range []string{"cpu", "memory", "io"} {
		p, err := ReadPressure("/proc", res)
		if errors.Is(err, ErrNoPSI) {
			t.Skipf("kernel without PSI: %v", err)
		}
		if err != nil {
			t.Fatalf("%s: %v", res, err)
		}
		if p.Some.Avg10 < 0 || p.Some.Avg10 > 100 {
			t.Errorf("%s: implausible %+v", res, p)
		}
	}
}
