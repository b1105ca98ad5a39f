package proc

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The two parsers of CPU time: /proc/<pid>/stat's utime+stime and schedstat's run time.
func TestParseCPUTimes(t *testing.T) {
	t.Parallel()
	stat, sched := ParseCPU, ParseSchedstat
	tests := []struct {
		name  string
		parse func([]byte) (time.Duration, error)
		in    string
		want  time.Duration
		err   bool
	}{
		{"stat: plain", stat, "42 (sleep) S 1 42 42 0 -1 4194304 100 0 0 0 150 50 0 0 20 0 1 0 100 1000 10", 2 * time.Second, false},
		{"stat: name with spaces and parens", stat, "7 (a) b) c) R 1 7 7 0 -1 0 0 0 0 0 3 7 0 0 20 0 1 0 1 1 1",
			100 * time.Millisecond, false},
		{"stat: no command", stat, "42 sleep S 1", 0, true},
		{"stat: too few fields", stat, "42 (x) S 1 2 3", 0, true},
		{"stat: bad number", stat, "42 (x) S 1 42 42 0 -1 0 0 0 0 0 x 50 0", 0, true},
		{"schedstat: three fields", sched, "1500000 200 7\n", 1500 * time.Microsecond, false},
		{"schedstat: one field", sched, "42", 42, false},
		{"schedstat: empty", sched, "", 0, true},
		{"schedstat: not a number", sched, "x 1 2", 0, true},
		{"schedstat: negative", sched, "-5 1 2", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := tc.parse([]byte(tc.in))
			if (err != nil) != tc.err || got != tc.want {
				t.Fatalf("parse = %v, %v; want %v (error %v)", got, err, tc.want, tc.err)
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
	if run, _, err := ReadSchedWait("/proc", os.Getpid()); err != nil || run <= 0 {
		t.Fatalf("ReadSchedWait: run %v, %v", run, err)
	}
}

func TestParseSchedstatWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in        string
		run, wait time.Duration
		ok        bool
	}{
		{"1500000 200 7\n", 1500 * time.Microsecond, 200, true},
		{"0 0 0", 0, 0, true},
		{"1500000", 0, 0, false},
		{"", 0, 0, false},
		{"1 -2 3", 0, 0, false},
		{"18446744073709551615 0 0", 0, 0, false},
	} {
		run, wait, err := ParseSchedstatWait([]byte(tc.in))
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrMalformed) || run != tc.run || wait != tc.wait {
			t.Errorf("ParseSchedstatWait(%q) = %v, %v, %v; want %v, %v, ok %v", tc.in, run, wait, err, tc.run, tc.wait, tc.ok)
		}
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

func FuzzParseSchedstat(f *testing.F) {
	for _, s := range []string{"1500000 200 7\n", "", "x", "18446744073709551615 0 0"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParseSchedstat(b)
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v does not wrap ErrMalformed", err)
		}
		if d < 0 {
			t.Fatalf("negative run time %v", d)
		}
		run, wait, err := ParseSchedstatWait(b)
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v does not wrap ErrMalformed", err)
		}
		if run < 0 || wait < 0 {
			t.Fatalf("negative times %v, %v", run, wait)
		}
	})
}

// ReadThreadsCPU sums the matching processes of a fake /proc and skips the others.
func TestReadThreadsCPU(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for pid, p := range map[string][2]string{
		"77":  {"kdamond.0\n", "2000000 5 6\n"},
		"78":  {"kdamond.1\n", "1000000 5 6\n"},
		"100": {"bash\n", "9000000 1 1\n"},
		"101": {"kdamond.2\n", ""}, // exited between comm and schedstat
	} {
		dir := filepath.Join(root, pid)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "comm"), []byte(p[0]), 0o644); err != nil {
			t.Fatal(err)
		}
		if p[1] != "" {
			if err := os.WriteFile(filepath.Join(dir, "schedstat"), []byte(p[1]), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.Mkdir(filepath.Join(root, "sys"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, n, err := ReadThreadsCPU(root, "kdamond")
	if err != nil || n != 2 || got != 3*time.Millisecond {
		t.Fatalf("ReadThreadsCPU = %v, %d, %v; want 3ms over 2", got, n, err)
	}
	if err := os.WriteFile(filepath.Join(root, "78", "schedstat"), []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadThreadsCPU(root, "kdamond"); !errors.Is(err, ErrMalformed) {
		t.Fatalf("malformed schedstat: %v", err)
	}
	if _, _, err := ReadThreadsCPU(filepath.Join(root, "none"), "kdamond"); err == nil {
		t.Fatal("a missing proc root is not an error")
	}
}
