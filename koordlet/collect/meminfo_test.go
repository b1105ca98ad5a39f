package collect

import (
	"errors"
	"os"
	"testing"
)

const realMemInfo = `MemTotal:        8124376 kB
MemFree:          512340 kB
MemAvailable:    6203112 kB
Buffers:          102400 kB
Cached:          5120000 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
`

func TestParseMemInfo(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    Memory
		wantErr bool
	}{
		{"real layout", realMemInfo, Memory{Total: 8124376 * 1024, Available: 6203112 * 1024}, false},
		{"order and no trailing newline", "MemAvailable: 1 kB\nMemTotal: 2 kB", Memory{Total: 2048, Available: 1024}, false},
		{"available zero", "MemTotal: 2 kB\nMemAvailable: 0 kB\n", Memory{Total: 2048}, false},
		{"missing MemAvailable (old kernel)", "MemTotal: 2 kB\nMemFree: 1 kB\n", Memory{}, true},
		{"missing MemTotal", "MemAvailable: 2 kB\n", Memory{}, true},
		{"MemTotal zero", "MemTotal: 0 kB\nMemAvailable: 0 kB\n", Memory{}, true},
		{"no unit", "MemTotal: 2\nMemAvailable: 1 kB\n", Memory{}, true},
		{"wrong unit", "MemTotal: 2 MB\nMemAvailable: 1 kB\n", Memory{}, true},
		{"not a number", "MemTotal: x kB\nMemAvailable: 1 kB\n", Memory{}, true},
		{"negative", "MemTotal: -2 kB\nMemAvailable: 1 kB\n", Memory{}, true},
		{"bytes overflow", "MemTotal: 18014398509481984 kB\nMemAvailable: 1 kB\n", Memory{}, true},
		{"repeated", "MemTotal: 2 kB\nMemTotal: 3 kB\nMemAvailable: 1 kB\n", Memory{}, true},
		{"empty", "", Memory{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseMemInfo([]byte(tc.in))
			if tc.wantErr {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("err = %v, want ErrMalformed (got %+v)", err, got)
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

func TestReadMemInfo(t *testing.T) {
	t.Parallel()
	good, bad, missing := t.TempDir(), t.TempDir(), t.TempDir()
	writeProc(t, good, "meminfo", realMemInfo)
	writeProc(t, bad, "meminfo", "MemTotal: 1 kB\n")
	tests := []struct {
		name    string
		root    string
		want    Memory
		wantErr error
	}{
		{"good", good, Memory{Total: 8124376 * 1024, Available: 6203112 * 1024}, nil},
		{"malformed", bad, Memory{}, ErrMalformed},
		{"missing", missing, Memory{}, os.ErrNotExist},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ReadMemInfo(tc.root)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestReadMemInfoRealProc is a smoke test against this machine's /proc.
func TestReadMemInfoRealProc(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/meminfo"); err != nil {
		t.Skipf("no /proc/meminfo: %v", err)
	}
	m, err := ReadMemInfo("/proc")
	if err != nil {
		t.Fatal(err)
	}
	if m.Total < 64<<20 || m.Available == 0 || m.Available > m.Total {
		t.Errorf("implausible memory %+v", m)
	}
}

func FuzzParseMemInfo(f *testing.F) {
	f.Add([]byte(realMemInfo))
	f.Add([]byte("MemTotal: 1 kB\nMemAvailable: 1 kB"))
	f.Add([]byte("MemTotal:\nMemAvailable: 99999999999999999999 kB\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseMemInfo(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			return
		}
		if m.Total == 0 || m.Total%1024 != 0 || m.Available%1024 != 0 {
			t.Fatalf("accepted %+v", m)
		}
	})
}
