package runqlat

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestLoadErrors: the failures a caller picks its fallback by. They are
// found before any BPF object is made, so they need no privileges.
func TestLoadErrors(t *testing.T) {
	t.Parallel()
	noBTF := filepath.Join(t.TempDir(), "vmlinux")
	noTracefs := t.TempDir()
	badBTF := filepath.Join(t.TempDir(), "garbage")
	if err := os.WriteFile(badBTF, []byte("not BTF"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		opts Options
		want []error
	}{
		{"no BTF", Options{Mode: ModeBTF, KernelBTF: noBTF}, []error{ErrNoBTF}},
		{"no tracefs", Options{Mode: ModeTracepoint, TracefsRoot: noTracefs}, []error{ErrNoTracefs}},
		{"neither", Options{KernelBTF: noBTF, TracefsRoot: noTracefs}, []error{ErrNoBTF, ErrNoTracefs}},
		{"unknown mode", Options{Mode: "kprobe"}, []error{ErrInvalid}},
		{"negative size", Options{MaxCgroups: -1}, []error{ErrInvalid}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := Load(tc.opts)
			if err == nil {
				p.Close()
				t.Fatal("Load succeeded")
			}
			for _, want := range tc.want {
				if !errors.Is(err, want) {
					t.Errorf("err = %v, want %v", err, want)
				}
			}
			if errors.Is(err, ErrPermission) {
				t.Errorf("err = %v, must not read as ErrPermission", err)
			}
		})
	}

	// A file that is not BTF is an error, but not "no BTF".
	_, err := Load(Options{Mode: ModeBTF, KernelBTF: badBTF})
	if err == nil || errors.Is(err, ErrNoBTF) {
		t.Errorf("garbage BTF: err = %v, want an error other than ErrNoBTF", err)
	}
}
