package mps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
	// cmdClientList lists the PIDs of one server's clients; cmdServerPercentage the
	// active thread percentage of one server (what its clients' own
	// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE can only lower).
	cmdClientList       = "get_client_list"
	cmdServerPercentage = "get_active_thread_percentage"
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

// Bounds of what the agent takes from the daemon's lists (outside input: the
// daemon's answers reach the agent through a binary it runs).
const (
	maxServers       = 64
	maxClients       = 4096
	maxListedOutput  = 64 << 10
	maxServerPercent = 100
)

// Server is one MPS server of the control daemon, as the daemon reports it.
type Server struct {
	PID int
	// ActiveThreadPercent is the server's active thread percentage
	// (get_active_thread_percentage); 0 when the daemon gave none.
	ActiveThreadPercent float64
	// Clients are its clients' PIDs (get_client_list), in the PID namespace of the
	// daemon: the host's where the daemon runs on the host or with hostPID.
	Clients []int
}

// ServerList is the daemon's servers at one check.
type ServerList struct {
	Servers []Server
	// Gen counts the lists read (0: none yet); a new Gen is a new list.
	Gen uint64
	// Err says why the last check could not read the clients ("" when it could); the
	// servers are then those of the last list read.
	Err string
}

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
	// self is the agent's own binary, which starts the daemon (StartWithPrivateShm).
	self    string
	ready   atomic.Bool
	servers atomic.Pointer[ServerList]

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
	d := &Daemon{cfg: cfg, log: log, self: selfExe}
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

// Servers returns the daemon's servers and their clients as of the last check (every
// CheckPeriod while the daemon answers); the zero ServerList before the first.
func (d *Daemon) Servers() ServerList {
	if l := d.servers.Load(); l != nil {
		return *l
	}
	return ServerList{}
}

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
	list, err := d.probe(ctx)
	if err != nil && d.cfg.Mode == ModeRun && ctx.Err() == nil {
		if d.started {
			d.log.Warn("MPS control daemon the agent started stopped answering; starting another",
				"pipeDirectory", d.cfg.PipeDirectory, "err", err)
		}
		d.started = false
		var serr error
		if list, serr = d.start(ctx); serr != nil {
			err = fmt.Errorf("%w; starting one: %w", err, serr)
		} else {
			err = nil
		}
	}
	d.set(err)
	if err == nil {
		d.listServers(ctx, list)
	}
}

// listServers asks the daemon for each server's clients and active thread percentage,
// serverList being its answer to get_server_list at this check, and stores the list
// (or, when that fails, why, keeping the last list).
func (d *Daemon) listServers(ctx context.Context, serverList string) {
	last := d.Servers()
	next := ServerList{Servers: last.Servers, Gen: last.Gen}
	servers, err := d.readServers(ctx, serverList)
	if err != nil {
		next.Err = err.Error()
		if last.Err != next.Err {
			d.log.Warn("cannot list the MPS servers' clients", "err", err)
		}
	} else {
		next.Servers, next.Gen = servers, last.Gen+1
	}
	d.servers.Store(&next)
}

// readServers parses get_server_list's answer, then runs get_client_list and
// get_active_thread_percentage for each server.
func (d *Daemon) readServers(ctx context.Context, serverList string) ([]Server, error) {
	pids, err := ParsePIDList(serverList, maxServers)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cmdServerList, err)
	}
	servers := make([]Server, 0, len(pids))
	for _, pid := range pids {
		s := Server{PID: pid}
		arg := strconv.Itoa(pid)
		out, err := d.command(ctx, cmdClientList+" "+arg+"\n")
		if err != nil {
			return nil, fmt.Errorf("%s %d: %w", cmdClientList, pid, err)
		}
		if s.Clients, err = ParsePIDList(out, maxClients); err != nil {
			return nil, fmt.Errorf("%s %d: %w", cmdClientList, pid, err)
		}
		// A daemon that does not answer the percentage leaves it unknown: the clients'
		// own caps must then hold.
		if out, err := d.command(ctx, cmdServerPercentage+" "+arg+"\n"); err == nil {
			s.ActiveThreadPercent = parsePercent(out)
		}
		servers = append(servers, s)
	}
	return servers, nil
}

// ErrMalformedList: a daemon's answer was not the list of PIDs it should be.
var ErrMalformedList = errors.New("malformed MPS control daemon list")

// ParsePIDList parses a control daemon's list of PIDs: one positive decimal PID a line
// (blank lines ignored), at most most of them and maxListedOutput bytes.
func ParsePIDList(out string, most int) ([]int, error) {
	if len(out) > maxListedOutput {
		return nil, fmt.Errorf("%d bytes: %w", len(out), ErrMalformedList)
	}
	var pids []int
	for line := range strings.SplitSeq(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		pid, err := strconv.ParseUint(line, 10, 31)
		if err != nil || pid == 0 {
			return nil, fmt.Errorf("%q is no PID: %w", truncate(line, 40), ErrMalformedList)
		}
		if len(pids) == most {
			return nil, fmt.Errorf("more than %d PIDs: %w", most, ErrMalformedList)
		}
		pids = append(pids, int(pid))
	}
	return pids, nil
}

// parsePercent reads get_active_thread_percentage's answer, a number in (0, 100]; 0
// for anything else.
func parsePercent(out string) float64 {
	v, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
	if err != nil || !(v > 0 && v <= maxServerPercent) {
		return 0
	}
	return v
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

// probe returns get_server_list's answer when a control daemon answers at the pipe
// directory: its control socket is there and get_server_list succeeds.
func (d *Daemon) probe(ctx context.Context) (string, error) {
	sock := filepath.Join(d.cfg.PipeDirectory, controlSocket)
	fi, err := os.Lstat(sock)
	if err != nil {
		return "", fmt.Errorf("no control socket: %w", err)
	}
	if fi.Mode()&(os.ModeSocket|os.ModeNamedPipe) == 0 {
		return "", fmt.Errorf("%s is a %v, not a socket", sock, fi.Mode().Type())
	}
	out, err := d.command(ctx, cmdServerList+"\n")
	if err != nil {
		return "", fmt.Errorf("control daemon does not answer: %w", err)
	}
	return out, nil
}

// start creates the shm directory, runs `<binary> -d` (it forks the daemon and
// returns) in a mount namespace of its own with the shm directory over /dev/shm
// (StartWithPrivateShm, through the agent's own binary), marks the daemon the
// agent's, and waits for its first answer (get_server_list's, returned).
func (d *Daemon) start(ctx context.Context) (string, error) {
	for _, dir := range []string{d.cfg.PipeDirectory, d.cfg.LogDirectory} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", fmt.Errorf("creating %s: %w", dir, err)
		}
	}
	if err := prepareShmDir(d.cfg.ShmDirectory, d.cfg.ClientUID); err != nil {
		return "", err
	}
	d.log.Info("starting MPS control daemon", "binary", d.cfg.ControlBinary, "pipeDirectory",
		d.cfg.PipeDirectory, "logDirectory", d.cfg.LogDirectory, "shmDirectory", d.cfg.ShmDirectory)
	// -d runs to its end even when shutdown comes meanwhile: a daemon forked by a
	// killed -d would be nobody's.
	if err := d.startDaemon(context.WithoutCancel(ctx)); err != nil {
		return "", fmt.Errorf("%s -d: %w", d.cfg.ControlBinary, err)
	}
	// Ours from now on, even if it never answers or shutdown comes first: quit it then.
	d.started = true
	deadline := time.Now().Add(startTimeout)
	for {
		list, err := d.probe(ctx)
		if err == nil {
			return list, nil
		}
		if !time.Now().Before(deadline) {
			return "", fmt.Errorf("started daemon did not answer within %v: %w", startTimeout, err)
		}
		t := time.NewTimer(startPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", ctx.Err()
		case <-t.C:
		}
	}
}

// prepareShmDir creates the shm directory (its parents 0755) or takes the one there:
// a real directory, not a link, made the client UID's alone (0700). MPS servers run
// as their clients' UID and create their shared memory there; nobody else needs it.
func prepareShmDir(dir string, uid int64) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(dir), err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("creating shm directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("shm directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("shm directory %s is a %v, not a directory", dir, fi.Mode().Type())
	}
	if err := os.Lchown(dir, int(uid), -1); err != nil {
		return fmt.Errorf("shm directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("shm directory: %w", err)
	}
	return nil
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
// CUDA_MPS_LOG_DIRECTORY added to the agent's environment and stdin, and returns its
// standard output.
func (d *Daemon) exec(ctx context.Context, stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.cfg.ControlBinary, args...)
	var out, errOut bytes.Buffer
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := d.runCmd(cmd); err != nil {
		if msg := strings.TrimSpace(errOut.String() + " " + out.String()); msg != "" {
			return "", fmt.Errorf("%w: %s", err, truncate(msg, 200))
		}
		return "", err
	}
	return out.String(), nil
}

// startDaemon runs `<binary> -d` through the agent's own binary in a mount namespace
// of its own (StartWithPrivateShm). -d forks the daemon, which keeps any pipe it
// inherited open: its standard error goes to an unlinked file, read once -d exits.
func (d *Daemon) startDaemon(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	cmd, err := privateShmCommand(ctx, d.self, d.cfg.ShmDirectory, HostShm, d.cfg.ControlBinary, "-d")
	if err != nil {
		return err
	}
	// Without a temporary directory the error goes unread; the exit status still tells.
	errFile, ferr := os.CreateTemp("", "mps-start-*")
	if ferr == nil {
		defer errFile.Close()
		_ = os.Remove(errFile.Name())
		cmd.Stderr = errFile
	}
	if err := d.runCmd(cmd); err != nil {
		if ferr == nil {
			msg, _ := io.ReadAll(io.NewSectionReader(errFile, 0, 4<<10))
			if m := strings.TrimSpace(string(msg)); m != "" {
				return fmt.Errorf("%w: %s", err, truncate(m, 200))
			}
		}
		return err
	}
	return nil
}

// runCmd runs cmd with the two MPS variables added to the agent's environment.
func (d *Daemon) runCmd(cmd *exec.Cmd) error {
	cmd.Env = append(cmd.Environ(), envPipeDirectory+"="+d.cfg.PipeDirectory, envLogDirectory+"="+d.cfg.LogDirectory)
	cmd.WaitDelay = time.Second
	return cmd.Run()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
