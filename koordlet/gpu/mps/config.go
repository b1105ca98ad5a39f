package mps

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Mode is how the agent gets its MPS control daemon.
type Mode string

// Modes.
const (
	// ModeDisabled: no MPS; every GPU container runs time-sliced and the on/off freeze
	// alone protects LS. The default.
	ModeDisabled Mode = "disabled"
	// ModeFind uses a control daemon someone else runs at PipeDirectory (a host
	// service, NVIDIA's device plugin) and never starts or stops one.
	ModeFind Mode = "find"
	// ModeRun uses the daemon at PipeDirectory, starting `<ControlBinary> -d` when none
	// answers, and quits it on shutdown only if the agent started it.
	ModeRun Mode = "run"
)

// Defaults: NVIDIA's own defaults for the pipe and log directories; a private shm
// directory the daemon must be started with as its /dev/shm (docs/gpu.md); a
// non-root client UID.
const (
	DefaultPipeDirectory = "/tmp/nvidia-mps"
	DefaultLogDirectory  = "/var/log/nvidia-mps"
	DefaultShmDirectory  = "/run/nvidia-mps-shm"
	DefaultControlBinary = "nvidia-cuda-mps-control"
	DefaultCheckPeriod   = 5 * time.Second
	DefaultClientUID     = 1000
)

// HostShm is the host's own POSIX shared memory directory, never an MPS shm
// directory: every host process's shared memory is there.
const HostShm = "/dev/shm"

// maxPipeDirectory bounds the pipe directory: the daemon's socket <dir>/control
// must fit a unix socket path (108 bytes with its terminating NUL), and the daemon
// dies without a word when it does not.
const maxPipeDirectory = 100 - len("/control")

// ErrInvalidConfig is wrapped by every configuration error; the message names the
// field.
var ErrInvalidConfig = errors.New("invalid MPS config")

// Config is gpu.mps of the agent's configuration.
type Config struct {
	// Mode is disabled (default), find or run.
	Mode Mode `json:"mode,omitempty"`
	// PipeDirectory is CUDA_MPS_PIPE_DIRECTORY: the host directory of the control
	// daemon's socket. Clients get it bind-mounted at the same path.
	PipeDirectory string `json:"pipeDirectory,omitempty"`
	// LogDirectory is CUDA_MPS_LOG_DIRECTORY of a daemon the agent starts.
	LogDirectory string `json:"logDirectory,omitempty"`
	// ShmDirectory is the host directory the daemon's servers see as /dev/shm; every
	// client gets it bind-mounted at /dev/shm (MPS clients and their server talk
	// through shared memory there). A directory of its own: the daemon is started
	// with it bind-mounted over its /dev/shm (docs/gpu.md); /run/nvidia/mps/shm for
	// NVIDIA's device plugin's daemon. Never the host's /dev/shm.
	ShmDirectory string `json:"shmDirectory,omitempty"`
	// ControlBinary is the nvidia-cuda-mps-control executable: a name looked up in
	// PATH, or an absolute path.
	ControlBinary string `json:"controlBinary,omitempty"`
	// CheckPeriod is how often the daemon is asked whether it still answers.
	CheckPeriod metav1.Duration `json:"checkPeriod,omitempty"`
	// ClientUID is the user ID every MPS client runs as (0 or unset: DefaultClientUID;
	// root is never one). The control daemon runs one server per UID, with that UID,
	// and only one at a time: a client of another UID waits at CUDA initialisation
	// until every client of the running server has exited. A container that runs as
	// another UID, as root, or whose UID is unknown, is not made an MPS client
	// (time-sliced; the freeze protects LS). The agent never changes a container's
	// user.
	ClientUID int64 `json:"clientUID,omitempty"`
}

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	if c.Mode == "" {
		c.Mode = ModeDisabled
	}
	if c.PipeDirectory == "" {
		c.PipeDirectory = DefaultPipeDirectory
	}
	if c.LogDirectory == "" {
		c.LogDirectory = DefaultLogDirectory
	}
	if c.ShmDirectory == "" {
		c.ShmDirectory = DefaultShmDirectory
	}
	if c.ControlBinary == "" {
		c.ControlBinary = DefaultControlBinary
	}
	if c.CheckPeriod.Duration == 0 {
		c.CheckPeriod.Duration = DefaultCheckPeriod
	}
	if c.ClientUID == 0 {
		c.ClientUID = DefaultClientUID
	}
	return c
}

// Validate checks c after defaults, also with mode disabled, so that a bad config
// shows before it is turned on.
func (c Config) Validate() error {
	c = c.WithDefaults()
	switch c.Mode {
	case ModeDisabled, ModeFind, ModeRun:
	default:
		return fmt.Errorf("mode %q: want %s, %s or %s: %w", c.Mode, ModeDisabled, ModeFind, ModeRun,
			ErrInvalidConfig)
	}
	for _, f := range []struct{ name, path string }{
		{"pipeDirectory", c.PipeDirectory}, {"logDirectory", c.LogDirectory}, {"shmDirectory", c.ShmDirectory},
	} {
		if err := absClean(f.path); err != nil {
			return fmt.Errorf("%s %q: %w", f.name, f.path, err)
		}
	}
	if c.ShmDirectory == HostShm {
		return fmt.Errorf("shmDirectory %q: the host's shared memory, readable and writable by every MPS client; "+
			"start the control daemon with a directory of its own as its /dev/shm and name that (docs/gpu.md): %w",
			c.ShmDirectory, ErrInvalidConfig)
	}
	if len(c.PipeDirectory) > maxPipeDirectory {
		return fmt.Errorf("pipeDirectory %q: %d bytes, at most %d (its control socket must fit a unix socket path): %w",
			c.PipeDirectory, len(c.PipeDirectory), maxPipeDirectory, ErrInvalidConfig)
	}
	if c.PipeDirectory == c.ShmDirectory || c.PipeDirectory == c.LogDirectory {
		return fmt.Errorf("pipeDirectory %q: must differ from logDirectory and shmDirectory: %w", c.PipeDirectory,
			ErrInvalidConfig)
	}
	if within(c.PipeDirectory, c.ShmDirectory) || within(c.ShmDirectory, c.PipeDirectory) {
		// Clients mount the shm directory read-write and the pipe directory read-only.
		return fmt.Errorf("pipeDirectory %q and shmDirectory %q: neither may lie inside the other: %w",
			c.PipeDirectory, c.ShmDirectory, ErrInvalidConfig)
	}
	if strings.ContainsAny(c.ControlBinary, " \t\n\x00") ||
		strings.Contains(c.ControlBinary, "/") && absClean(c.ControlBinary) != nil {
		return fmt.Errorf("controlBinary %q: want a name in PATH or a clean absolute path: %w", c.ControlBinary,
			ErrInvalidConfig)
	}
	if p := c.CheckPeriod.Duration; p < 100*time.Millisecond || p > 10*time.Minute {
		return fmt.Errorf("checkPeriod %v: must be within [100ms, 10m]: %w", p, ErrInvalidConfig)
	}
	if c.ClientUID < 1 || c.ClientUID > 1<<32-2 {
		return fmt.Errorf("clientUID %d: want 1..4294967294 (0 or unset: %d): %w", c.ClientUID, DefaultClientUID,
			ErrInvalidConfig)
	}
	return nil
}

// within reports whether clean absolute path p lies below dir.
func within(p, dir string) bool {
	return strings.HasPrefix(p, dir+"/")
}

// absClean accepts an absolute, clean path other than "/" without NUL or newline
// (the value goes into environment variables and mounts).
func absClean(p string) error {
	switch {
	case !filepath.IsAbs(p):
		return fmt.Errorf("not an absolute path: %w", ErrInvalidConfig)
	case filepath.Clean(p) != p:
		return fmt.Errorf("not a clean path (want %q): %w", filepath.Clean(p), ErrInvalidConfig)
	case p == "/":
		return fmt.Errorf("the root directory: %w", ErrInvalidConfig)
	case strings.ContainsAny(p, "\x00\n,:="):
		return fmt.Errorf("contains NUL, newline, comma, colon or '=': %w", ErrInvalidConfig)
	}
	return nil
}
