package collect

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/internal/testenv"
)

const ms10 = 10 * time.Millisecond // one USER_HZ tick

// realStat is a /proc/stat captured from a 2-CPU machine.
const realStat = `cpu  2209 3 1670 88217 536 7 29 59 11 2
cpu0 966 0 729 44543 85 0 12 27 0 0
cpu1 1243 3 941 43673 450 7 17 32 11 2
intr 136047 0 0 0 0 0 0 0 0 0 0
ctxt 255603
btime 1700000000
processes 4242
procs_running 2
procs_blocked 0
softirq 1 2 3 4 5 6 7 8 9 10 11
`

func writeProc(t *testing.T, root, name, data string) {
	t.Helper()
	path := filepath.Join(root, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestParseProcStat(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    CPUTimes
		wantErr bool
	}{
		{
			name: "real layout; guest not double counted",
			in:   realStat,
			// busy = user 2209 + nice 3 + system 1670 + irq 7 + softirq 29 + steal 59
			want: CPUTimes{Busy: 3977 * ms10, Total: (3977 + 88217 + 536) * ms10, CPUs: 2},
		},
		{
			name: "old kernel with four columns",
			in:   "cpu 10 20 30 40\ncpu0 10 20 30 40\n",
			want: CPUTimes{Busy: 60 * ms10, Total: 100 * ms10, CPUs: 1},
		},
		{
			name: "future kernel with extra columns",
			in:   "cpu 1 1 1 1 1 1 1 1 1 1 99 99\ncpu0 1\ncpu1 1\ncpu2 1\n",
			want: CPUTimes{Busy: 6 * ms10, Total: 8 * ms10, CPUs: 3},
		},
		{
			name: "no trailing newline",
			in:   "cpu  1 2 3 4 5 6 7 8 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0",
			want: CPUTimes{Busy: 27 * ms10, Total: 36 * ms10, CPUs: 1},
		},
		{
			name: "cpu lines after others are not counted",
			in:   "cpu 1 0 0 1\ncpu0 1 0 0 1\nintr 5\ncpu9 1 1 1 1\n",
			want: CPUTimes{Busy: 1 * ms10, Total: 2 * ms10, CPUs: 1},
		},
		{
			name: "zero counters",
			in:   "cpu 0 0 0 0 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n",
			want: CPUTimes{CPUs: 1},
		},
		{name: "empty", in: "", wantErr: true},
		{name: "no aggregate line", in: "cpu0 1 2 3 4\nintr 1\n", wantErr: true},
		{name: "no per-cpu lines", in: "cpu 1 2 3 4\nintr 1\n", wantErr: true},
		{name: "too few columns", in: "cpu 1 2 3\ncpu0 1 2 3\n", wantErr: true},
		{name: "negative", in: "cpu 1 -2 3 4\ncpu0 1\n", wantErr: true},
		{name: "not a number", in: "cpu 1 2 x 4\ncpu0 1\n", wantErr: true},
		{name: "overflow", in: "cpu 18446744073709551616 0 0 0\ncpu0 1\n", wantErr: true},
		{name: "repeated aggregate", in: "cpu 1 2 3 4\ncpu 1 2 3 4\ncpu0 1\n", wantErr: true},
		{name: "tabs", in: "cpu\t1 2 3 4\ncpu0 1\n", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseProcStat([]byte(tc.in))
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

func TestProcStatReadsFakeFile(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeProc(t, root, "stat", realStat)
	p, err := NewProcStat(root)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got, err := p.Read()
	if err != nil {
		t.Fatal(err)
	}
	if want := (CPUTimes{Busy: 3977 * ms10, Total: 92730 * ms10, CPUs: 2}); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	// The file is re-read from offset 0 each time: in-place rewrites are seen.
	updated := strings.Replace(realStat, "cpu  2209", "cpu  2309", 1)
	if err := os.WriteFile(filepath.Join(root, "stat"), []byte(updated), 0o644); err != nil {
		t.Fatal(err)
	}
	got2, err := p.Read()
	if err != nil {
		t.Fatal(err)
	}
	if d := got2.Busy - got.Busy; d != time.Second {
		t.Errorf("busy grew by %v, want 1s", d)
	}
}

// TestProcStatGrowsBuffer: a file whose CPU section is larger than the
// initial buffer (many CPUs) is read whole rather than truncated.
func TestProcStatGrowsBuffer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		cpus  int
		intr  int // length of the trailing intr line
		check func(t *testing.T, p *ProcStat)
	}{
		{name: "small", cpus: 2, intr: 10},
		{name: "cpu section larger than buffer", cpus: 2048, intr: 10},
		{name: "huge trailing line only", cpus: 4, intr: 4 * procStatInitialBuf, check: func(t *testing.T, p *ProcStat) {
			if len(p.buf) != procStatInitialBuf {
				t.Errorf("buffer grew to %d although the cpu section fit", len(p.buf))
			}
		}},
		{name: "cpu section ends exactly at buffer end", cpus: -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var sb strings.Builder
			cpus := tc.cpus
			if cpus < 0 {
				// Pad one cpu line so the file is exactly the buffer size.
				sb.WriteString("cpu  1 0 0 1\ncpu0 1 0 0 1")
				sb.WriteString(strings.Repeat(" 0", (procStatInitialBuf-sb.Len()-1)/2))
				for sb.Len() < procStatInitialBuf-1 {
					sb.WriteString("0")
				}
				sb.WriteString("\n")
				cpus = 1
				if sb.Len() != procStatInitialBuf {
					t.Fatalf("fixture is %d bytes", sb.Len())
				}
			} else {
				fmt.Fprintf(&sb, "cpu  %d 0 0 %d\n", cpus, cpus)
				for i := range cpus {
					fmt.Fprintf(&sb, "cpu%d 1 0 0 1 0 0 0 0 0 0\n", i)
				}
				sb.WriteString("intr " + strings.Repeat("0", tc.intr) + "\n")
			}
			root := t.TempDir()
			writeProc(t, root, "stat", sb.String())
			p, err := NewProcStat(root)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			got, err := p.Read()
			if err != nil {
				t.Fatal(err)
			}
			if got.CPUs != cpus {
				t.Errorf("CPUs = %d, want %d", got.CPUs, cpus)
			}
			if tc.check != nil {
				tc.check(t, p)
			}
		})
	}
}

func TestNewProcStatErrors(t *testing.T) {
	t.Parallel()
	missing := t.TempDir()
	bad := t.TempDir()
	writeProc(t, bad, "stat", "intr 1\n")
	tests := []struct {
		name string
		root string
		want error
	}{
		{"missing", missing, os.ErrNotExist},
		{"malformed", bad, ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := NewProcStat(tc.root)
			if !errors.Is(err, tc.want) || p != nil {
				t.Errorf("NewProcStat = %v, %v; want %v", p, err, tc.want)
			}
		})
	}
}

func TestProcStatReadAfterClose(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeProc(t, root, "stat", realStat)
	p, err := NewProcStat(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Read(); err == nil {
		t.Error("Read after Close succeeded")
	}
}

// TestProcStatRealProc is a smoke test against this machine's /proc.
func TestProcStatRealProc(t *testing.T) {
	t.Parallel()
	p, err := NewProcStat("/proc")
	if err != nil {
		t.Skipf("no usable /proc/stat: %v", err)
	}
	defer p.Close()
	a, err := p.Read()
	if err != nil {
		t.Fatal(err)
	}
	if a.CPUs != runtime.NumCPU() {
		t.Errorf("CPUs = %d, runtime.NumCPU() = %d (affinity-restricted or CPUs offline?)", a.CPUs, runtime.NumCPU())
	}
	if a.Busy <= 0 || a.Total <= a.Busy {
		t.Errorf("implausible times %+v", a)
	}
	// The kernel adds to Total on every tick of every CPU: wait for the next one (a
	// loaded machine may take longer than a tick to run this goroutine again).
	b := a
	grew := testenv.Poll(5*time.Second, func() bool {
		if b, err = p.Read(); err != nil {
			t.Fatal(err)
		}
		if b.Busy < a.Busy {
			t.Fatalf("Busy went backwards: %v -> %v", a.Busy, b.Busy)
		}
		return b.Total > a.Total
	})
	if !grew {
		t.Errorf("Total did not grow in 5 s: %v -> %v", a.Total, b.Total)
	}
}

func BenchmarkProcStatRead(b *testing.B) {
	p, err := NewProcStat("/proc")
	if err != nil {
		b.Skipf("no usable /proc/stat: %v", err)
	}
	defer p.Close()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Read(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseProcStat(b *testing.B) {
	in := []byte(realStat)
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		if _, err := ParseProcStat(in); err != nil {
			b.Fatal(err)
		}
	}
}

// Not parallel: AllocsPerRun counts process-wide allocations.
func TestProcStatReadDoesNotAllocate(t *testing.T) {
	root := t.TempDir()
	writeProc(t, root, "stat", realStat)
	p, err := NewProcStat(root)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if n := testing.AllocsPerRun(100, func() {
		if _, err := p.Read(); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Read allocates %.1f times per call, want 0", n)
	}
}

func FuzzParseProcStat(f *testing.F) {
	f.Add([]byte(realStat))
	f.Add([]byte("cpu 1 2 3 4\ncpu0 1 2 3 4\n"))
	f.Add([]byte("cpu 18446744073709551615 18446744073709551615 1 1 1 1 1 1\ncpu0\n"))
	f.Add([]byte("cpu0\ncpu \n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ParseProcStat(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			return
		}
		if got.CPUs < 1 {
			t.Fatalf("accepted input with %d CPUs", got.CPUs)
		}
		// A truncated read of the same bytes must never disagree with the
		// whole-file parse when it reports completeness.
		for cut := 0; cut <= len(b); cut += 1 + len(b)/8 {
			part, complete, err := parseProcStat(b[:cut], true)
			if err == nil && complete && part != got {
				t.Fatalf("partial parse of %d bytes = %+v, whole = %+v", cut, part, got)
			}
		}
	})
}
