package gpu

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/understory/understory/qos"
)

// writeCPUStat writes <root>/<pid>/stat as the kernel does, with the process's start time
// and its CPU in clock ticks (utime, stime).
func writeCPUStat(t *testing.T, root string, pid uint32, start, utime, stime uint64) {
	t.Helper()
	dir := filepath.Join(root, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprintf("%d (py thon) x) S 1 1 1 0 -1 4194304 0 0 0 0 %d %d 0 0 20 0 9 0 %d 1000 100 18446744073709551615\n",
		pid, utime, stime, start)
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestParseStatCPU(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want processStat
		ok   bool
	}{
		{name: "utime + stime", in: "7 (a) S 1 1 1 0 -1 0 0 0 0 0 30 12 0 0 20 0 1 0 555", want: processStat{start: 555, cpuTicks: 42}, ok: true},
		{name: "utime not a number", in: "7 (a) S 1 1 1 0 -1 0 0 0 0 0 x 12 0 0 20 0 1 0 555"},
		{name: "stime not a number", in: "7 (a) S 1 1 1 0 -1 0 0 0 0 0 1 -2 0 0 20 0 1 0 555"},
		{name: "overflow", in: "7 (a) S 1 1 1 0 -1 0 0 0 0 0 18446744073709551615 1 0 0 20 0 1 0 555"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseStat([]byte(tc.in))
			if (err == nil) != tc.ok || got != tc.want {
				t.Fatalf("parseStat = %+v, %v; want %+v, ok %t", got, err, tc.want, tc.ok)
			}
		})
	}
}

// TestWakeWatchRead: a process's CPU is measured over whole windows (100 ms) from its
// first read; a reused PID, a counter that goes back or a clock that goes back start
// over; an exited process is forgotten.
func TestWakeWatchRead(t *testing.T) {
	t.Parallel()
	type read struct {
		at        time.Duration
		start     uint64 // 0: the process is gone
		ticks     uint64
		pct       float64
		ok        bool
		forgotten bool
	}
	const ms = time.Millisecond
	tests := []struct {
		name  string
		reads []read
	}{
		{name: "windows of 100 ms, the last one repeated between", reads: []read{
			{at: 0, start: 9, ticks: 100},
			{at: 50 * ms, start: 9, ticks: 103},                     // no whole window yet
			{at: 100 * ms, start: 9, ticks: 105, pct: 50, ok: true}, // 5 ticks = 50 ms in 100 ms
			{at: 150 * ms, start: 9, ticks: 120, pct: 50, ok: true},
			{at: 200 * ms, start: 9, ticks: 125, pct: 200, ok: true}, // two threads busy
			{at: 300 * ms, start: 9, ticks: 125, pct: 0, ok: true},
		}},
		{name: "a reused PID starts over", reads: []read{
			{at: 0, start: 9, ticks: 100},
			{at: 100 * ms, start: 9, ticks: 101, pct: 10, ok: true},
			{at: 200 * ms, start: 10, ticks: 500},
			{at: 300 * ms, start: 10, ticks: 500, pct: 0, ok: true},
		}},
		{name: "counter or clock going back starts over", reads: []read{
			{at: 0, start: 9, ticks: 100},
			{at: 100 * ms, start: 9, ticks: 90},
			{at: 50 * ms, start: 9, ticks: 95},
			{at: 150 * ms, start: 9, ticks: 97, pct: 20, ok: true},
		}},
		{name: "exited: forgotten", reads: []read{
			{at: 0, start: 9, ticks: 100},
			{at: 100 * ms, start: 0, forgotten: true},
			{at: 200 * ms, start: 9, ticks: 200},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			w := newWakeWatch(root)
			t0 := time.Unix(1_700_000_000, 0)
			for i, r := range tc.reads {
				if r.start == 0 {
					if err := os.RemoveAll(filepath.Join(root, "7")); err != nil {
						t.Fatal(err)
					}
				} else {
					writeCPUStat(t, root, 7, r.start, r.ticks, 0)
				}
				w.step++
				pct, ok := w.read(t0.Add(r.at), 7)
				if ok != r.ok || (ok && pct != r.pct) {
					t.Fatalf("read %d at %v: %v, %t; want %v, %t", i, r.at, pct, ok, r.pct, r.ok)
				}
				if _, kept := w.pids[7]; kept == r.forgotten {
					t.Fatalf("read %d: kept %t, want %t", i, kept, !r.forgotten)
				}
			}
		})
	}
}

// TestManagerLSWakes: an LS process that holds its context and was idle starts using the
// CPU while batch runs: batch is frozen within the CPU window (two 50 ms steps), before
// the driver's per-process sample shows any GPU use; an LS process busy on the CPU but
// not on the GPU costs batch one hold.
func TestManagerLSWakes(t *testing.T) {
	t.Parallel()
	r := newMPSRig(t) // MPS server ready, but no process is a client: the freeze lever
	writeCPUStat(t, r.procRoot, 100, 7, 1000, 10)
	writeCPUStat(t, r.procRoot, 200, 8, 50000, 10)
	// LS arrives (frozen for the hold, 200 ms), then sits idle: batch runs.
	var d qos.GPUThrottleDecision
	for i := range 10 {
		d = r.step(t, lsProc(0), batchProc)
		if i == 0 && d.Reason != qos.GPUReasonLSArrived {
			t.Fatalf("step 0: %+v", d)
		}
	}
	if d.Frozen || d.Reason != qos.GPUReasonIdle || d.LSCPU == nil || *d.LSCPU != 0 {
		t.Fatalf("idle LS holding its context: %+v", d)
	}
	// LS wakes: 60 % of a core from now on; its GPU sample still reads 0.
	ticks := uint64(1000)
	woke := -1
	for i := range 4 {
		ticks += 3 // 30 ms of CPU per 50 ms step
		writeCPUStat(t, r.procRoot, 100, 7, ticks, 10)
		d = r.step(t, lsProc(0), batchProc)
		if d.Frozen {
			woke = i
			break
		}
	}
	if woke < 0 || woke > 1 || d.Reason != qos.GPUReasonLSWoke || d.LSCPU == nil || *d.LSCPU < 20 {
		t.Fatalf("LS woke on the CPU: frozen at step %d (want 0 or 1): %+v", woke, d)
	}
	// Busy on the CPU, never on the GPU: thawed after the hold, not frozen for as long as
	// the CPU is busy.
	thawed := false
	for range 10 {
		ticks += 3
		writeCPUStat(t, r.procRoot, 100, 7, ticks, 10)
		if d = r.step(t, lsProc(0), batchProc); !d.Frozen {
			thawed = true
			break
		}
	}
	if !thawed || d.Reason != qos.GPUReasonIdle {
		t.Fatalf("CPU-busy LS without GPU work kept batch frozen: %+v", d)
	}
}
