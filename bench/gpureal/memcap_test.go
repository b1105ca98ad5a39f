package gpureal

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// startFake starts one of the driver's fakes (the test binary, TestMain dispatches) with
// extra environment, and waits until it is ready.
func startFake(t *testing.T, role string, env ...string) *workload {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sub := fakeLSCmd
	if role != roleLS {
		sub = fakeBatchCmd
	}
	cmd := exec.Command(self, sub)
	cmd.Env = append(os.Environ(), env...)
	w, err := startCmd(role, cmd, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.cmd.Process.Kill()
		<-w.exited
	})
	if err := w.waitReady(context.Background(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return w
}

const (
	clientPipe = "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"
	limit1G    = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M"
)

// TestMemCapCheckFakes drives the memory-cap check through the protocol with the
// driver's fakes: a batch client with a limit stops at it and LS keeps its memory (met);
// a batch stand-in that is no MPS client is not checked; an MPS client without a limit
// fails the check before any allocation; LS unable to hold its memory stops it.
func TestMemCapCheckFakes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name             string
		batchEnv         []string
		hold             int
		met              bool
		verdict          string
		grabbed, further int
	}{
		{"capped batch, LS kept", []string{clientPipe, limit1G}, 2048, true,
			"met: batch out of memory after 1024 MiB (limit 1024 MiB); LS kept its 2048 MiB and got 34816 MiB more",
			1024, 34816},
		{"the limit in GiB", []string{clientPipe, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=1=5M,0=2G"}, 2048, true,
			"batch out of memory after 2048 MiB (limit 2048 MiB)", 2048, 34816},
		{"no MPS client", []string{"CUDA_MPS_PIPE_DIRECTORY=/dev/null/understory-no-mps"}, 2048, false,
			"not run: the batch stand-in is no MPS client", 0, 0},
		{"no CUDA_MPS_* at all", nil, 2048, false, "not run", 0, 0},
		{"an MPS client without a limit", []string{clientPipe}, 2048, false,
			"NOT met: the batch MPS client got no CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for device 0", 0, 0},
		{"a limit for another device only", []string{clientPipe, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=1=1024M"}, 2048,
			false, "NOT met", 0, 0},
		{"LS cannot hold its memory", []string{clientPipe, limit1G}, 100000, false, "not run: LS could not hold", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ls := startFake(t, roleLS)
			batch := startFake(t, roleBatch, tc.batchEnv...)
			res, err := memCapCheck(context.Background(), ls, batch, phMemCap, 500, tc.hold)
			if err != nil {
				t.Fatal(err)
			}
			if res.Met != tc.met || !strings.Contains(res.Verdict, tc.verdict) {
				t.Fatalf("verdict %v %q, want %v %q", res.Met, res.Verdict, tc.met, tc.verdict)
			}
			if tc.grabbed > 0 && (res.BatchGrab == nil || res.BatchGrab.GotMiB != tc.grabbed || res.LSFurtherMiB != tc.further) {
				t.Fatalf("batch grabbed %+v, LS further %d; want %d, %d", res.BatchGrab, res.LSFurtherMiB, tc.grabbed, tc.further)
			}
			// Both freed what they held: a second check starts from nothing.
			if tc.met {
				res, err = memCapCheck(context.Background(), ls, batch, phMemCap, 500, tc.hold)
				if err != nil || !res.Met || res.LSHold.HeldMiB != tc.hold {
					t.Fatalf("second check: %+v, %v", res, err)
				}
			}
		})
	}
}

// TestMemCapCheckPython: the same check through ls.py and batch.py (standin.Memory) with
// the fake torch, whose allocations stop at CUDA_MPS_PINNED_DEVICE_MEM_LIMIT as CUDA's
// would; with a CUDA that ignored the limit, batch allocates past it and the check fails.
func TestMemCapCheckPython(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		batchEnv []string
		met      bool
		verdict  string
	}{
		{"the limit holds", []string{clientPipe, limit1G}, true, "met: batch out of memory after 1024 MiB"},
		{"a CUDA that ignores the limit", []string{clientPipe, limit1G, "FAKE_TORCH_IGNORE_LIMIT=1"}, false,
			"NOT met: batch allocated 81920 MiB, past its limit of 1024 MiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ls := startPy(t, "ls.py", []string{fakeTorch}, "--rate", "200", "--warmup", "1")
			batch := startPy(t, "batch.py", append([]string{fakeTorch}, tc.batchEnv...), "--every", "2", "--size", "16")
			for _, w := range []*workload{ls, batch} {
				if err := w.waitReady(context.Background(), 30*time.Second); err != nil {
					t.Fatal(err)
				}
			}
			if got := batch.ready.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]; got != "0=1024M" {
				t.Fatalf("batch.py reported the limit %q", got)
			}
			res, err := memCapCheck(context.Background(), ls, batch, phMemCap, 500, 2048)
			if err != nil {
				t.Fatal(err)
			}
			if res.Met != tc.met || !strings.Contains(res.Verdict, tc.verdict) {
				t.Fatalf("verdict %v %q, want %v %q", res.Met, res.Verdict, tc.met, tc.verdict)
			}
			if c := res.LSCheck; c == nil || c.Intact == nil || !*c.Intact || c.HeldMiB != 2048 || c.TotalMiB != 81920 ||
				!res.BatchGrab.OOM || !strings.Contains(res.BatchGrab.OOMError, "out of memory") {
				t.Fatalf("LS check %+v, batch grab %+v", res.LSCheck, res.BatchGrab)
			}
			// The stand-ins freed everything and still run.
			start := time.Now().Add(50 * time.Millisecond)
			if err := batch.send(command{Cmd: "run", Phase: "after", Start: unix(start), End: unix(start) + 0.2}); err != nil {
				t.Fatal(err)
			}
			if ev, err := batch.next(context.Background(), "result", 10*time.Second); err != nil || len(ev.Syncs) == 0 {
				t.Fatalf("batch after the check: %+v, %v", ev, err)
			}
		})
	}
}

// TestMemCapVerdict: met only when batch stopped at an out-of-memory error within its
// limit and LS kept its memory and got its further allocation.
func TestMemCapVerdict(t *testing.T) {
	t.Parallel()
	yes, no := true, false
	ok := memCapResult{BatchLimitMiB: 1000, LSFurtherMiB: 500,
		BatchGrab: &memOpResult{GotMiB: 900, OOM: true, OOMError: "CUDA out of memory"},
		LSCheck:   &memOpResult{HeldMiB: 2048, GotMiB: 500, Intact: &yes}}
	with := func(f func(*memCapResult)) memCapResult {
		r := ok
		g, c := *ok.BatchGrab, *ok.LSCheck
		r.BatchGrab, r.LSCheck = &g, &c
		f(&r)
		return r
	}
	for _, tc := range []struct {
		name string
		r    memCapResult
		met  bool
		want string
	}{
		{"met", ok, true, "met: batch out of memory after 900 MiB (limit 1000 MiB); LS kept its 2048 MiB"},
		{"batch exactly at its limit", with(func(r *memCapResult) { r.BatchGrab.GotMiB = 1000 }), true, "met"},
		{"batch past its limit", with(func(r *memCapResult) { r.BatchGrab.GotMiB = 1256 }), false,
			"past its limit of 1000 MiB"},
		{"batch never refused", with(func(r *memCapResult) { r.BatchGrab.OOM = false }), false,
			"without an out-of-memory error"},
		{"LS's memory changed", with(func(r *memCapResult) { r.LSCheck.Intact = &no }), false, "did not keep its contents"},
		{"LS's memory unchecked", with(func(r *memCapResult) { r.LSCheck.Intact = nil }), false, "did not keep"},
		{"LS refused more", with(func(r *memCapResult) {
			r.LSCheck.OOM, r.LSCheck.GotMiB, r.LSCheck.OOMError = true, 256, "CUDA out of memory"
		}), false, "LS got 256 of 500 MiB more (CUDA out of memory)"},
		{"both wrong", with(func(r *memCapResult) {
			r.BatchGrab.GotMiB, r.LSCheck.OOM = 5000, true
		}), false, "past its limit of 1000 MiB; LS got"},
		{"a step missing", with(func(r *memCapResult) { r.LSCheck = nil }), false, "not run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			met, why := memCapVerdict(tc.r)
			if met != tc.met || !strings.Contains(why, tc.want) {
				t.Fatalf("memCapVerdict = %v %q, want %v %q", met, why, tc.met, tc.want)
			}
		})
	}
}

func TestMemLimitDevice0(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		v    string
		want int
		ok   bool
	}{
		{"0=35942M", 35942, true},
		{"0=2G", 2048, true},
		{"1=5M,0=7M", 7, true},
		{"0=1024", 0, false},
		{"0=0M", 0, false},
		{"00=5M", 0, false},
		{"1=5M", 0, false},
		{"", 0, false},
		{"0=-5M", 0, false},
	} {
		if got, ok := memLimitDevice0(tc.v); got != tc.want || ok != tc.ok {
			t.Errorf("memLimitDevice0(%q) = %d, %v; want %d, %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}

// The stand-ins' files the check needs exist where the driver looks for them.
func TestMemCapStandInFiles(t *testing.T) {
	t.Parallel()
	for _, f := range []string{"standin.py", "ls.py", "batch.py"} {
		b, err := os.ReadFile(filepath.Join("workloads", f))
		if err != nil {
			t.Fatal(err)
		}
		if f != "standin.py" && !strings.Contains(string(b), "mem.handle(cmd)") {
			t.Errorf("%s does not answer the mem command", f)
		}
	}
}
