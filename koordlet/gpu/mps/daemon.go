package mps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
)

// Control daemon commands and environment (NVIDIA's MPS documentation, "Tools and
// Interface Reference").
const (
	envPipeDirectory = "CUDA_MPS_PIPE_DIRECTORY"
	envLogDirectory  = "CUDA_MPS_LOG_DIRECTORY"
	// cmdServerList lists the PIDs of the daemon's servers (none until a client
	// came): the daemon answers it, so it is the liveness question.
	cmdServerList = "get_server_list"
	// cmdQuit ends the daemon and its servers.
	cmdQuit = "quit"
	// controlSocket is the daemon's socket in the pipe directory.
	controlSocket = "control"
)

// Timeouts of one control command and of a started daemon's first answer.
const (
	commandTimeout = 5 * time.Second
	startTimeout   = 5 * time.Second
	startPoll      = 50 * time.Millisecond
)

// ErrDisabled: New was given mode disabled.
var ErrDisabled = errors.New("MPS disabled (gpu.mps.mode " + string(ModeDisabled) + ")")

// commandFunc runs the control binary with args and stdin in the daemon's
// environment and returns its standard output.
type commandFunc func(ctx context.Context, stdin string, args ...string) (string, error)

// Daemon finds (mode find) or runs (mode run) the node's MPS control daemon and
// tells whether it answers. Ready and PipeDir are safe for concurrent use; Run is
// called once.
type Daemon struct {
	cfg     Config
	log     *slog.Logger
	command commandFunc
	ready   atomic.Bool

	// Run goroutine's state.
	started bool   // the agent started the daemon that answers now
	why     string // why it is not ready (the last state logged)
	checked bool   // a state was logged
}

// New returns the daemon of cfg (mode find or run; ErrDisabled for disabled).
func New(cfg Config, log *slog.Logger) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	if cfg.Mode == ModeDisabled {
		return nil, ErrDisabled
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Daemon{cfg: cfg, log: log}
	d.command = d.exec
	return d, nil
}

// PipeDir is CUDA_MPS_PIPE_DIRECTORY, the host path clients mount.
func (d *Daemon) PipeDir() string { return d.cfg.PipeDirectory }

// ShmDir is the host directory clients mount at /dev/shm.
func (d *Daemon) ShmDir() string { return d.cfg.ShmDirectory }

// ClientUID is the only user ID clients may run as (Config.ClientUID).
func (d *Daemon) ClientUID() int64 { return d.cfg.ClientUID }

// Ready reports whether the control daemon answered at the last check.
func (d *Daemon) Ready() bool { return d.ready.Load() }

// Run checks the daemon now and every CheckPeriod (starting it in mode run when it
// does not answer) until ctx ends; then, in mode run, it quits a daemon the agent
// started. It returns nil when ctx ends.
func (d *Daemon) Run(ctx context.Context) error {
	defer d.shutdown()
	d.check(ctx)
	t := time.NewTicker(d.cfg.CheckPeriod.Duration)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			d.check(ctx)
		}
	}
}

// check asks the daemon, starts one in mode run, and records and logs the outcome.
func (d *Daemon) check(ctx context.Context) {
	err := d.probe(ctx)
	if err != nil && d.cfg.Mode == ModeRun && ctx.Err() == nil {
		if d.started {
			d.log.Warn("MPS control daemon the agent started stopped answering; starting another",
				"pipeDirectory", d.cfg.PipeDirectory, "err", err)
		}
		d.started = false
		if serr := d.start(ctx); serr != nil {
			err = fmt.Errorf("%w; starting one: %w", err, serr)
		} else {
			err = nil
		}
	}
	d.set(err)
}

// set records the outcome and logs a change.
func (d *Daemon) set(err error) {
	ready := err == nil
	why := ""
	if err != nil {
		why = err.Error()
	}
	was := d.ready.Swap(ready)
	if d.checked && was == ready && why == d.why {
		return
	}
	d.checked, d.why = true, why
	if ready {
		d.log.Info("MPS control daemon ready", "mode", d.cfg.Mode, "pipeDirectory", d.cfg.PipeDirectory,
			"startedByAgent", d.started)
		return
	}
	d.log.Warn("MPS control daemon not ready; GPU containers start without MPS", "mode", d.cfg.Mode,
		"pipeDirectory", d.cfg.PipeDirectory, "err", err)
}

// probe returns nil when a control daemon answers at the pipe directory: its
// control socket is there and get_server_list succeeds.
func (d *Daemon) probe(ctx context.Context) error {
	sock := filepath.Join(d.cfg.PipeDirectory, controlSocket)
	fi, err := os.Lstat(sock)
	if err != nil {
		return fmt.Errorf("no control socket: %w", err)
	}
	if fi.Mode()&(os.ModeSocket|os.ModeNamedPipe) == 0 {
		return fmt.Errorf("%s is a %v, not a socket", sock, fi.Mode().Type())
	}
	if _, err := d.command(ctx, cmdServerList+"\n"); err != nil {
		return fmt.Errorf("control daemon does not answer: %w", err)
	}
	return nil
}

// start runs `<binary> -d` (it forks the daemon and returns), marks the daemon the
// agent's, and waits for its first answer.
func (d *Daemon) start(ctx context.Context) error {
	for _, dir := range []string{d.cfg.PipeDirectory, d.cfg.LogDirectory} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", dir, err)
		}
	}
	d.log.Info("starting MPS control daemon", "binary", d.cfg.ControlBinary, "pipeDirectory",
		d.cfg.PipeDirectory, "logDirectory", d.cfg.LogDirectory)
	// -d runs to its end even when shutdown comes meanwhile: a daemon forked by a
	// killed -d would be nobody's.
	if _, err := d.command(context.WithoutCancel(ctx), "", "-d"); err != nil {
		return fmt.Errorf("%s -d: %w", d.cfg.ControlBinary, err)
	}
	// Ours from now on, even if it never answers or shutdown comes first: quit it then.
	d.started = true
	deadline := time.Now().Add(startTimeout)
	for {
		err := d.probe(ctx)
		if err == nil {
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("started daemon did not answer within %v: %w", startTimeout, err)
		}
		t := time.NewTimer(startPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// shutdown marks the daemon not ready and quits it if the agent started it.
func (d *Daemon) shutdown() {
	d.ready.Store(false)
	if !d.started {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	if _, err := d.command(ctx, cmdQuit+"\n"); err != nil {
		d.log.Error("cannot quit the MPS control daemon the agent started", "pipeDirectory", d.cfg.PipeDirectory,
			"err", err)
		return
	}
	d.started = false
	d.log.Info("MPS control daemon the agent started quit", "pipeDirectory", d.cfg.PipeDirectory)
}

// exec runs the control binary with CUDA_MPS_PIPE_DIRECTORY and
// CUDA_MPS_LOG_DIRECTORY added to the agent's environment. With -d the binary forks
// the daemon, which keeps any pipe it inherited open: the daemon's output is not
// read (it logs to the log directory).
func (d *Daemon) exec(ctx context.Context, stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.cfg.ControlBinary, args...)
	cmd.Env = append(cmd.Environ(), envPipeDirectory+"="+d.cfg.PipeDirectory, envLogDirectory+"="+d.cfg.LogDirectory)
	cmd.WaitDelay = time.Second
	var out, errOut bytes.Buffer
	if len(args) == 0 {
		cmd.Stdin = strings.NewReader(stdin)
		cmd.Stdout, cmd.Stderr = &out, &errOut
	}
	if err := cmd.Run(); err != nil {
		if msg := strings.TrimSpace(errOut.String() + " " + out.String()); msg != "" {
			return "", fmt.Errorf("%w: %s", err, truncate(msg, 200))
		}
		return "", err
	}
	return out.String(), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
