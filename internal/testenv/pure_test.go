package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// errRecorder is a testing.TB that records Errorf and Fatalf instead of failing.
type errRecorder struct {
	testing.TB
	errs []string
}

func (r *errRecorder) Helper() {}
func (r *errRecorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *errRecorder) Fatalf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *errRecorder) Fatal(args ...any) { r.errs = append(r.errs, fmt.Sprint(args...)) }

func TestCheckPure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		src  string
		want []string // substrings, one per expected error; nil: pure
	}{
		{name: "pure", src: "package p\nimport \"strings\"\nvar _ = strings.ToUpper\n"},
		{name: "time types only", src: "package p\nimport \"time\"\nvar _ time.Duration\n"},
		{name: "os", src: "package p\nimport \"os\"\nvar _ = os.Getpid\n", want: []string{`imports "os"`}},
		{name: "clock", src: "package p\nimport \"time\"\nvar _ = time.Now()\n",
			want: []string{"calls time.Now("}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(tc.src), 0o644); err != nil {
				t.Fatal(err)
			}
			// A test file may import anything.
			if err := os.WriteFile(filepath.Join(dir, "p_test.go"), []byte("package p\nimport _ \"net\"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			r := &errRecorder{TB: t}
			CheckPure(r, dir, "strings", "time")
			if len(r.errs) != len(tc.want) {
				t.Fatalf("errors %q, want %d naming %q", r.errs, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(r.errs[i], w) {
					t.Errorf("error %q does not name %q", r.errs[i], w)
				}
			}
		})
	}
}
