package duty

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fakeTool is a stand-in for cuda-checkpoint: it appends its arguments to args.log next to
// itself and keeps the process's CUDA state in the file "state" there (default running).
// A file "fail" makes --toggle fail; "stuck" makes --toggle not change the state; "slow"
// makes every call sleep 10 s.
const fakeTool = `#!/bin/sh
dir=$(dirname "$0")
echo "$*" >> "$dir/args.log"
[ -f "$dir/slow" ] && sleep 10
state=$(cat "$dir/state" 2>/dev/null || echo running)
case "$1" in
--help|-h)
	echo "CUDA checkpoint and restore utility."
	echo "--get-state --pid <pid>"
	echo "--toggle --pid <pid>"
	exit 0;;
--get-state)
	echo "$state"
	exit 0;;
--toggle)
	if [ -f "$dir/fail" ]; then echo "Error toggling pid $3: OS call failed or operation not supported" >&2; exit 1; fi
	[ -f "$dir/stuck" ] && exit 0
	if [ "$state" = running ]; then echo checkpointed > "$dir/state"; else echo running > "$dir/state"; fi
	exit 0;;
esac
echo "unknown option $1" >&2
exit 2
`

// writeTool writes an executable script into a new temp dir and returns its path. It
// waits out ETXTBSY: a process forked meanwhile by a parallel test holds the write fd
// until it execs.
func writeTool(t *testing.T, script string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cuda-checkpoint")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		err := exec.Command(path, "--probe-exec").Run()
		if !errors.Is(err, syscall.ETXTBSY) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s stays busy: %v", path, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = os.Remove(filepath.Join(filepath.Dir(path), "args.log"))
	return path
}

func toolArgs(t *testing.T, tool string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(filepath.Dir(tool), "args.log"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func setToolFile(t *testing.T, tool, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(filepath.Dir(tool), name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func enabled(path string) SuspendConfig {
	c := DefaultSuspendConfig()
	c.Enabled, c.Path = true, path
	return c
}

func TestSuspendConfig(t *testing.T) {
	t.Parallel()
	def := DefaultSuspendConfig()
	if def.Enabled || def.Path != "cuda-checkpoint" || def.Timeout.Duration != time.Minute {
		t.Fatalf("DefaultSuspendConfig() = %+v", def)
	}
	if err := def.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := SuspendConfig{Path: " ", Timeout: metav1.Duration{Duration: -time.Second}}
	err := bad.Validate()
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "path: empty") ||
		!strings.Contains(err.Error(), "timeout: -1s") {
		t.Fatalf("Validate = %v", err)
	}
}

func TestNewCheckpointer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tool := writeTool(t, fakeTool)
	noFlags := writeTool(t, "#!/bin/sh\necho 'usage: cuda-checkpoint --get-state --pid P'\nexit 1\n")
	notExec := filepath.Join(t.TempDir(), "cuda-checkpoint")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	broken := writeTool(t, "#!/nonexistent/interpreter\n")
	for _, tc := range []struct {
		name string
		cfg  SuspendConfig
		want error
	}{
		{"gate off", SuspendConfig{Path: tool, Timeout: metav1.Duration{Duration: time.Second}}, ErrCheckpointDisabled},
		{"bad config", SuspendConfig{Enabled: true, Path: tool}, ErrInvalidConfig},
		{"missing", enabled(filepath.Join(t.TempDir(), "cuda-checkpoint")), ErrNoCheckpointTool},
		{"not in PATH", enabled("understory-no-such-cuda-checkpoint"), ErrNoCheckpointTool},
		{"not executable", enabled(notExec), ErrNoCheckpointTool},
		{"cannot start", enabled(broken), ErrNoCheckpointTool},
		{"no --toggle", enabled(noFlags), ErrNoCheckpointTool},
		{"ok", enabled(tool), nil},
	} {
		c, err := NewCheckpointer(ctx, tc.cfg)
		if !errors.Is(err, tc.want) || (tc.want == nil) != (c != nil) {
			t.Errorf("%s: NewCheckpointer = %v, %v; want %v", tc.name, c, err, tc.want)
		}
	}
	c, err := NewCheckpointer(ctx, enabled(tool))
	if err != nil {
		t.Fatal(err)
	}
	if c.Path() != tool {
		t.Fatalf("Path = %q", c.Path())
	}
	if got := toolArgs(t, tool); !reflect.DeepEqual(got[len(got)-1:], []string{"--help"}) {
		t.Fatalf("probe ran %q", got)
	}
}

func TestSuspendResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		state    string // initial; "" = running
		files    []string
		op       func(*Checkpointer) error
		wantErr  error
		wantArgs []string
		final    string
	}{
		{name: "suspend running", op: suspend(4242),
			wantArgs: []string{"--get-state --pid 4242", "--toggle --pid 4242", "--get-state --pid 4242"},
			final:    "checkpointed"},
		{name: "suspend checkpointed is a no-op", state: "checkpointed", op: suspend(7),
			wantArgs: []string{"--get-state --pid 7"}, final: "checkpointed"},
		{name: "resume checkpointed", state: "checkpointed", op: resume(7),
			wantArgs: []string{"--get-state --pid 7", "--toggle --pid 7", "--get-state --pid 7"}, final: "running"},
		{name: "resume running is a no-op", op: resume(7), wantArgs: []string{"--get-state --pid 7"}, final: "running"},
		{name: "locked is refused", state: "locked", op: suspend(7), wantErr: ErrCheckpointState,
			wantArgs: []string{"--get-state --pid 7"}, final: "locked"},
		{name: "failed is refused", state: "failed", op: resume(7), wantErr: ErrCheckpointState,
			wantArgs: []string{"--get-state --pid 7"}, final: "failed"},
		{name: "unknown state", state: "hibernating", op: suspend(7), wantErr: ErrCheckpointState,
			wantArgs: []string{"--get-state --pid 7"}, final: "hibernating"},
		{name: "toggle fails", files: []string{"fail"}, op: suspend(7), wantErr: ErrCheckpointFailed,
			wantArgs: []string{"--get-state --pid 7", "--toggle --pid 7"}, final: "running"},
		{name: "toggle without effect", files: []string{"stuck"}, op: suspend(7), wantErr: ErrCheckpointState,
			wantArgs: []string{"--get-state --pid 7", "--toggle --pid 7", "--get-state --pid 7"}, final: "running"},
		{name: "bad pid", op: suspend(0), wantErr: ErrInvalidPID, final: "running"},
		{name: "negative pid", op: resume(-1), wantErr: ErrInvalidPID, final: "running"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tool := writeTool(t, fakeTool)
			c, err := NewCheckpointer(ctx, enabled(tool))
			if err != nil {
				t.Fatal(err)
			}
			_ = os.Remove(filepath.Join(filepath.Dir(tool), "args.log")) // forget the probe
			if tc.state != "" {
				setToolFile(t, tool, "state", tc.state+"\n")
			}
			for _, f := range tc.files {
				setToolFile(t, tool, f, "")
			}
			err = tc.op(c)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if got := toolArgs(t, tool); !reflect.DeepEqual(got, tc.wantArgs) {
				t.Fatalf("tool ran %q, want %q", got, tc.wantArgs)
			}
			st, err := c.State(ctx, 7)
			if tc.final == "hibernating" {
				if !errors.Is(err, ErrCheckpointState) {
					t.Fatalf("State = %v, %v", st, err)
				}
				return
			}
			if err != nil || string(st) != tc.final {
				t.Fatalf("final state %q, %v; want %q", st, err, tc.final)
			}
		})
	}
}

func suspend(pid int) func(*Checkpointer) error {
	return func(c *Checkpointer) error { return c.Suspend(context.Background(), pid) }
}

func resume(pid int) func(*Checkpointer) error {
	return func(c *Checkpointer) error { return c.Resume(context.Background(), pid) }
}

// The tool's error output reaches the error message, clipped.
func TestCheckpointErrorMessage(t *testing.T) {
	t.Parallel()
	tool := writeTool(t, fakeTool)
	c, err := NewCheckpointer(context.Background(), enabled(tool))
	if err != nil {
		t.Fatal(err)
	}
	setToolFile(t, tool, "fail", "")
	err = c.Suspend(context.Background(), 99)
	if !errors.Is(err, ErrCheckpointFailed) || !strings.Contains(err.Error(), "operation not supported") ||
		!strings.Contains(err.Error(), "--toggle --pid 99") {
		t.Fatalf("Suspend = %v", err)
	}
	if got := clip(strings.Repeat("x", 2000)); len(got) > maxToolOutput+8 {
		t.Fatalf("clip kept %d bytes", len(got))
	}
}

// A hung tool is killed at the timeout.
func TestCheckpointTimeout(t *testing.T) {
	t.Parallel()
	tool := writeTool(t, fakeTool)
	cfg := enabled(tool)
	cfg.Timeout = metav1.Duration{Duration: 200 * time.Millisecond}
	c, err := NewCheckpointer(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	setToolFile(t, tool, "slow", "")
	start := time.Now()
	_, err = c.State(context.Background(), 7)
	if !errors.Is(err, ErrCheckpointFailed) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("State with a hung tool = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("a hung tool held State for %v", d)
	}
	// The caller's ctx bounds it too.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Suspend(ctx, 7); !errors.Is(err, context.Canceled) {
		t.Fatalf("Suspend with a cancelled ctx = %v", err)
	}
}

func FuzzParseCheckpointState(f *testing.F) {
	for _, seed := range []string{"running\n", "checkpointed", " LOCKED \n", "failed", "", "\x00", "running\nlocked",
		strings.Repeat("x", 4096), "Error: CUDA_ERROR_NOT_INITIALIZED"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, out string) {
		st, err := ParseCheckpointState(out)
		switch {
		case err == nil:
			if st != StateRunning && st != StateLocked && st != StateCheckpointed && st != StateFailed {
				t.Fatalf("ParseCheckpointState(%q) = %q, nil", out, st)
			}
		case !errors.Is(err, ErrCheckpointState) || st != "":
			t.Fatalf("ParseCheckpointState(%q) = %q, %v", out, st, err)
		case len(err.Error()) > 2*maxToolOutput+100:
			t.Fatalf("error of %d bytes for %d bytes of output", len(err.Error()), len(out))
		}
	})
}
