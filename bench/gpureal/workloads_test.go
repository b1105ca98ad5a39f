package gpureal

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// python returns python3, or skips.
func python(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 here")
	}
	return p
}

// startPy starts a stand-in of workloads/ with the fake torch of testdata (or none).
func startPy(t *testing.T, script string, env []string, args ...string) *workload {
	t.Helper()
	cmd := exec.Command(python(t), append([]string{"-u", filepath.Join("workloads", script)}, args...)...)
	cmd.Env = append(append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1"), env...)
	w, err := startCmd(script, cmd, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.cmd.Process.Kill()
		<-w.exited
	})
	return w
}

var fakeTorch = "PYTHONPATH=" + filepath.Join("testdata", "faketorch")

// TestPythonStandInsProtocol drives ls.py and batch.py through the driver's protocol
// code with a fake torch: ready, timed runs, idle, stop, quit.
func TestPythonStandInsProtocol(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls := startPy(t, "ls.py", []string{fakeTorch, "CUDA_MPS_CLIENT_PRIORITY=0"}, "--rate", "200", "--warmup", "3")
	batch := startPy(t, "batch.py", []string{fakeTorch}, "--every", "4", "--size", "16")
	for _, w := range []*workload{ls, batch} {
		if err := w.waitReady(ctx, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if w.ready.Device != "fake GPU 0" || w.ready.Torch != "0.0+fake" || w.ready.PID == 0 {
			t.Fatalf("%s ready: %+v", w.role, w.ready)
		}
	}
	if ls.ready.Env["CUDA_MPS_CLIENT_PRIORITY"] != "0" {
		t.Fatalf("ls.py did not report its MPS environment: %v", ls.ready.Env)
	}

	start := time.Now().Add(100 * time.Millisecond)
	for _, w := range []*workload{ls, batch} {
		if err := w.send(command{Cmd: "run", Phase: "p1", Start: unix(start), End: unix(start) + 0.5,
			Mode: "run"}); err != nil {
			t.Fatal(err)
		}
	}
	ev, err := ls.next(ctx, "result", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// 200/s over 0.5 s: 100 requests scheduled 5 ms apart, each a few ms late at most.
	if ev.Phase != "p1" || len(ev.Sched) != 100 || len(ev.LatMS) != 100 || ev.Unsent != 0 {
		t.Fatalf("ls result: phase %q, %d scheduled, %d latencies, %d unsent", ev.Phase, len(ev.Sched),
			len(ev.LatMS), ev.Unsent)
	}
	if ev.Sched[1]-ev.Sched[0] < 0.0049 || ev.Sched[1]-ev.Sched[0] > 0.0051 {
		t.Fatalf("requests scheduled %v s apart", ev.Sched[1]-ev.Sched[0])
	}
	ev, err = batch.next(ctx, "result", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Every != 4 || len(ev.Syncs) < 10 || ev.Syncs[0] < 0 || ev.Syncs[len(ev.Syncs)-1] > 0.6 {
		t.Fatalf("batch result: every %d, %d syncs (%v .. %v)", ev.Every, len(ev.Syncs), ev.Syncs[0],
			ev.Syncs[len(ev.Syncs)-1])
	}

	// Idle LS, and a batch run until stop.
	start = time.Now()
	if err := ls.send(command{Cmd: "run", Phase: "idle", Start: unix(start), End: unix(start) + 0.2,
		Mode: "idle"}); err != nil {
		t.Fatal(err)
	}
	if err := batch.send(command{Cmd: "run", Phase: "p2", Start: unix(start)}); err != nil {
		t.Fatal(err)
	}
	if ev, err = ls.next(ctx, "result", 10*time.Second); err != nil || ev.Phase != "idle" || len(ev.Sched) != 0 {
		t.Fatalf("idle ls: %+v, %v", ev, err)
	}
	if err := batch.send(command{Cmd: "stop"}); err != nil {
		t.Fatal(err)
	}
	if ev, err = batch.next(ctx, "result", 10*time.Second); err != nil || ev.Phase != "p2" || len(ev.Syncs) == 0 {
		t.Fatalf("stopped batch: %v, %v", ev.Phase, err)
	}
	for _, w := range []*workload{ls, batch} {
		if err := w.quit(10*time.Second, nil); err != nil {
			t.Fatal(err)
		}
		<-w.exited
		if w.cmd.ProcessState.ExitCode() != 0 {
			t.Fatalf("%s exited %d", w.role, w.cmd.ProcessState.ExitCode())
		}
	}
}

// TestPythonStandInsFailClearly: without torch, or without CUDA, a stand-in says so and
// exits 3, and the driver reports its message.
func TestPythonStandInsFailClearly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, script string
		env          []string
		want         string
	}{
		{"no CUDA", "ls.py", []string{fakeTorch, "FAKE_TORCH_CUDA=0"}, "sees no CUDA device"},
		{"no CUDA (batch)", "batch.py", []string{fakeTorch, "FAKE_TORCH_CUDA=0"}, "sees no CUDA device"},
		{"no torch", "batch.py", []string{"PYTHONPATH=" + t.TempDir()}, "PyTorch is not installed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.name == "no torch" {
				if exec.Command(python(t), "-c", "import torch").Run() == nil {
					t.Skip("torch is installed here")
				}
			}
			w := startPy(t, tc.script, tc.env)
			err := w.waitReady(context.Background(), 30*time.Second)
			if !errors.Is(err, errWorkloadFailed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("waitReady = %v, want %q", err, tc.want)
			}
			<-w.exited
			if code := w.cmd.ProcessState.ExitCode(); code != 3 {
				t.Fatalf("exit %d, want 3", code)
			}
		})
	}
}
