package duty

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults of [SuspendConfig].
const (
	DefaultCheckpointTool = "cuda-checkpoint"
	// DefaultCheckpointTimeout bounds one call of the tool. A suspend copies the process's
	// device memory to host memory: seconds for tens of GiB.
	DefaultCheckpointTimeout = time.Minute
	// maxToolOutput bounds how much of the tool's output goes into an error message.
	maxToolOutput = 512
)

// Errors of the suspend path, for callers to branch on.
var (
	// ErrCheckpointDisabled: the feature gate is off (SuspendConfig.Enabled false).
	ErrCheckpointDisabled = errors.New("duty: GPU suspend (cuda-checkpoint) is disabled")
	// ErrNoCheckpointTool: the cuda-checkpoint binary is missing, not executable, or
	// does not offer --toggle and --get-state.
	ErrNoCheckpointTool = errors.New("duty: no usable cuda-checkpoint tool")
	// ErrCheckpointFailed: the tool ran and failed, or did not finish in time.
	ErrCheckpointFailed = errors.New("duty: cuda-checkpoint failed")
	// ErrCheckpointState: the process is in a CUDA state the operation cannot go on from
	// (locked by someone else, failed, or a state this code does not know), or a toggle
	// did not reach the wanted state.
	ErrCheckpointState = errors.New("duty: unexpected CUDA checkpoint state")
	// ErrInvalidPID: a pid <= 0.
	ErrInvalidPID = errors.New("duty: invalid pid")
	// ErrInvalidConfig is wrapped by every SuspendConfig validation error.
	ErrInvalidConfig = errors.New("duty: invalid suspend config")
)

// SuspendConfig is the feature gate and settings of "suspend": before evicting a batch pod
// starved on a GPU, the agent may suspend its CUDA processes with NVIDIA's cuda-checkpoint
// (driver >= 550), which releases their GPU memory, and resume them later. Plain data with
// JSON/YAML tags, for the agent's config; pre-fill with DefaultSuspendConfig.
type SuspendConfig struct {
	// Enabled is the feature gate; off by default.
	Enabled bool `json:"enabled"`
	// Path is the cuda-checkpoint binary; a name without a slash is looked up in PATH.
	Path string `json:"path"`
	// Timeout bounds one call of the tool, > 0.
	Timeout metav1.Duration `json:"timeout"`
}

// DefaultSuspendConfig returns the defaults (gate off). It passes Validate.
func DefaultSuspendConfig() SuspendConfig {
	return SuspendConfig{Path: DefaultCheckpointTool, Timeout: metav1.Duration{Duration: DefaultCheckpointTimeout}}
}

// Validate reports every bad field (checked even with the gate off, so a config error
// shows before the gate is turned on); errors wrap ErrInvalidConfig.
func (c SuspendConfig) Validate() error {
	var errs []error
	if strings.TrimSpace(c.Path) == "" {
		errs = append(errs, fmt.Errorf("suspend path: empty: %w", ErrInvalidConfig))
	}
	if c.Timeout.Duration <= 0 {
		errs = append(errs, fmt.Errorf("suspend timeout: %v must be > 0: %w", c.Timeout.Duration, ErrInvalidConfig))
	}
	return errors.Join(errs...)
}

// CheckpointState is a process's CUDA state as `cuda-checkpoint --get-state` prints it.
type CheckpointState string

// States printed by cuda-checkpoint --get-state.
const (
	StateRunning      CheckpointState = "running"
	StateLocked       CheckpointState = "locked"
	StateCheckpointed CheckpointState = "checkpointed"
	StateFailed       CheckpointState = "failed"
)

// Checkpointer suspends and resumes the CUDA state of processes with cuda-checkpoint. It
// holds no state of its own and is safe for concurrent use, but two calls on the same pid
// at once race in the driver: the caller serialises per pid.
type Checkpointer struct {
	path    string
	timeout time.Duration
}

// NewCheckpointer checks the gate and the config and probes for the tool: it must be
// found (exec.LookPath) and its --help must list --toggle and --get-state. The error
// wraps ErrCheckpointDisabled, ErrInvalidConfig or ErrNoCheckpointTool. The probe cannot
// tell whether the driver supports checkpointing (>= 550): that shows on the first call.
func NewCheckpointer(ctx context.Context, cfg SuspendConfig) (*Checkpointer, error) {
	if !cfg.Enabled {
		return nil, ErrCheckpointDisabled
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	path, err := exec.LookPath(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("finding %s: %w: %w", cfg.Path, ErrNoCheckpointTool, err)
	}
	c := &Checkpointer{path: path, timeout: cfg.Timeout.Duration}
	// The tool may exit non-zero after printing its help; only its output counts.
	out, _, runErr := c.run(ctx, "--help")
	if runErr != nil && !isExit(runErr) {
		return nil, fmt.Errorf("running %s --help: %w: %w", path, ErrNoCheckpointTool, runErr)
	}
	for _, flag := range []string{"--toggle", "--get-state"} {
		if !strings.Contains(out, flag) {
			return nil, fmt.Errorf("%s --help does not list %s (output %s): %w", path, flag, clip(out), ErrNoCheckpointTool)
		}
	}
	return c, nil
}

// Path returns the tool's resolved path.
func (c *Checkpointer) Path() string { return c.path }

// State returns pid's CUDA state. A process without CUDA makes the tool fail
// (ErrCheckpointFailed).
func (c *Checkpointer) State(ctx context.Context, pid int) (CheckpointState, error) {
	if pid <= 0 {
		return "", fmt.Errorf("cuda-checkpoint state of pid %d: %w", pid, ErrInvalidPID)
	}
	out, errOut, err := c.run(ctx, "--get-state", "--pid", strconv.Itoa(pid))
	if err != nil {
		return "", c.failed("--get-state", pid, out, errOut, err)
	}
	st, err := ParseCheckpointState(out)
	if err != nil {
		return "", fmt.Errorf("cuda-checkpoint --get-state --pid %d: %w", pid, err)
	}
	return st, nil
}

// ParseCheckpointState reads the output of `cuda-checkpoint --get-state`: one of the
// State* words (any case, surrounding white space ignored). Anything else is an error
// wrapping ErrCheckpointState that quotes at most 512 bytes of it.
func ParseCheckpointState(out string) (CheckpointState, error) {
	st := CheckpointState(strings.ToLower(strings.TrimSpace(out)))
	switch st {
	case StateRunning, StateLocked, StateCheckpointed, StateFailed:
		return st, nil
	}
	return "", fmt.Errorf("unknown CUDA checkpoint state %s: %w", clip(out), ErrCheckpointState)
}

// Suspend moves pid's CUDA state from running to checkpointed: the driver locks its CUDA
// APIs, waits for submitted work, copies device memory to host memory and releases the
// GPU. A process already checkpointed is left alone. The process must not be frozen (the
// driver does the work on a thread of the process): Release its cgroup from the cycler
// first.
func (c *Checkpointer) Suspend(ctx context.Context, pid int) error {
	return c.toggleTo(ctx, pid, StateRunning, StateCheckpointed)
}

// Resume moves pid's CUDA state from checkpointed back to running (memory copied back at
// the same addresses, APIs unlocked). A running process is left alone.
func (c *Checkpointer) Resume(ctx context.Context, pid int) error {
	return c.toggleTo(ctx, pid, StateCheckpointed, StateRunning)
}

func (c *Checkpointer) toggleTo(ctx context.Context, pid int, from, to CheckpointState) error {
	st, err := c.State(ctx, pid)
	if err != nil {
		return err
	}
	switch st {
	case to:
		return nil
	case from:
	default:
		return fmt.Errorf("pid %d is %s, cannot go from %s to %s: %w", pid, st, from, to, ErrCheckpointState)
	}
	out, errOut, err := c.run(ctx, "--toggle", "--pid", strconv.Itoa(pid))
	if err != nil {
		return c.failed("--toggle", pid, out, errOut, err)
	}
	st, err = c.State(ctx, pid)
	if err != nil {
		return err
	}
	if st != to {
		return fmt.Errorf("pid %d is %s after --toggle, want %s: %w", pid, st, to, ErrCheckpointState)
	}
	return nil
}

// run runs the tool with args, bounded by the timeout and ctx.
func (c *Checkpointer) run(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.path, args...)
	// A tool that forked helpers keeping its pipes open must not hold us past the kill.
	cmd.WaitDelay = time.Second
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w (after %v)", ctx.Err(), c.timeout)
	}
	return o.String(), e.String(), err
}

func (c *Checkpointer) failed(op string, pid int, out, errOut string, err error) error {
	msg := strings.TrimSpace(errOut)
	if msg == "" {
		msg = strings.TrimSpace(out)
	}
	return fmt.Errorf("cuda-checkpoint %s --pid %d: %w: %w (output %s)", op, pid, ErrCheckpointFailed, err, clip(msg))
}

func isExit(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee)
}

// clip quotes at most maxToolOutput bytes of s.
func clip(s string) string {
	if len(s) > maxToolOutput {
		return strconv.Quote(s[:maxToolOutput]) + "..."
	}
	return strconv.Quote(s)
}
