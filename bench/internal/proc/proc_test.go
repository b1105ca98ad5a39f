package proc

import (
	"errors"
	"os"
	"testing"
	"time"
)

func TestParseCPU(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want time.Duration
		err  bool
	}{
		{"plain", "42 (sleep) S 1 42 42 0 -1 4194304 100 0 0 0 150 50 0 0 20 0 1 0 100 1000 10", 2 * time.Second, false},
		{"name with spaces and parens", "7 (a) b) c) R 1 7 7 0 -1 0 0 0 0 0 3 7 0 0 20 0 1 0 1 1 1", 100 * time.Millisecond,
			false},
		{"no command", "42 sleep S 1", 0, true},
		{"too few fields", "42 (x) S 1 2 3", 0, true},
		{"bad number", "42 (x) S 1 42 42 0 -1 0 0 0 0 0 x 50 0", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseCPU([]byte(tc.in))
			if (err != nil) != tc.err || got != tc.want {
				t.Fatalf("ParseCPU = %v, %v; want %v (error %v)", got, err, tc.want, tc.err)
			}
			if err != nil && !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
		})
	}
}

func TestParseRSS(t *testing.T) {
	t.Parallel()
	rss, peak, err := ParseRSS([]byte("Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n"))
	if err != nil || rss != 1<<20 || peak != 2<<20 {
		t.Fatalf("got %d %d %v", rss, peak, err)
	}
	if _, _, err := ParseRSS([]byte("Name:\tkthread\n")); !errors.Is(err, ErrMalformed) {
		t.Fatalf("no VmRSS: %v", err)
	}
}

// The real thing: this process has used some CPU and memory.
func TestReadSelf(t *testing.T) {
	t.Parallel()
	if _, err := ReadCPU("/proc", os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if rss, _, err := ReadRSS("/proc", os.Getpid()); err != nil || rss == 0 {
		t.Fatalf("rss %d, %v", rss, err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("42 (sleep) S 1 42 42 0 -1 4194304 100 0 0 0 150 50 0 0 20 0 1 0 100 1000 10"))
	f.Add([]byte("VmRSS:\t1024 kB\nVmHWM:\t2048 kB\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if d, err := ParseCPU(b); err == nil && d < 0 {
			t.Fatalf("negative cpu %v", d)
		}
		if rss, _, err := ParseRSS(b); err == nil && rss == 0 {
			t.Fatal("nil error without rss")
		}
	})
}
