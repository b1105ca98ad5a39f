package gpureal

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The stand-ins' protocol: JSON lines. The driver writes commands on the stand-in's
// stdin; the stand-in writes events on its stdout (its stderr is its log).
//
//	{"cmd":"run","phase":P,"start":UNIX,"end":UNIX,"mode":"run"|"idle"}  end 0: until stop
//	{"cmd":"stop"}   end the current run now
//	{"cmd":"quit"}   exit
//	{"cmd":"mem","phase":P,"op":"hold"|"grab"|"check"|"free","mib":N,"chunk_mib":C}  device memory (memcap.go)
//	{"event":"ready","pid":N,"device":..,"torch":..,"env":{..},"warm_ms":..}
//	{"event":"result","phase":P,"start":UNIX, LS: "sched","lat_ms","unsent"; batch: "syncs","every"}
//	{"event":"mem","phase":P,"op":..,"held_mib","got_mib","oom","oom_error","intact","free_mib","total_mib"}
//	{"event":"error","error":TEXT}
type command struct {
	Cmd   string  `json:"cmd"`
	Phase string  `json:"phase,omitempty"`
	Start float64 `json:"start,omitempty"`
	End   float64 `json:"end,omitempty"`
	Mode  string  `json:"mode,omitempty"`
	// Op, MiB and ChunkMiB are a "mem" command's.
	Op       string `json:"op,omitempty"`
	MiB      int    `json:"mib,omitempty"`
	ChunkMiB int    `json:"chunk_mib,omitempty"`
}

type event struct {
	Event  string            `json:"event"`
	Phase  string            `json:"phase,omitempty"`
	Error  string            `json:"error,omitempty"`
	PID    int               `json:"pid,omitempty"`
	Device string            `json:"device,omitempty"`
	Torch  string            `json:"torch,omitempty"`
	Env    map[string]string `json:"env,omitempty"`
	WarmMS float64           `json:"warm_ms,omitempty"`
	Start  float64           `json:"start,omitempty"`
	lsRunResult
	batchRunResult
	memOpResult
}

// Errors callers branch on.
var (
	errWorkloadExited = errors.New("stand-in exited")
	errWorkloadFailed = errors.New("stand-in reported an error")
)

// unix is t as float seconds since the epoch (the protocol's clock: CLOCK_REALTIME,
// shared by every process on the host).
func unix(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// workload is one running stand-in.
type workload struct {
	role   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan event
	exited chan struct{}
	err    error // set before exited closes
	ready  event
	mu     sync.Mutex
}

// launchSpec is how to start a stand-in: its argv, the extra environment and bind
// mounts (NRI's adjustments), the container cgroup it must run in, its user.
type launchSpec struct {
	Role       string
	Self       string // this binary, which re-executes itself as the launcher
	CgroupRoot string
	Cgroup     string // container cgroup, relative to CgroupRoot
	// UID is the user (and group) the stand-in runs as; the launcher's (the driver's)
	// when it is that already.
	UID int
	// Mounts are made in a mount namespace of the stand-in's own.
	Mounts []launchMount
	Argv   []string
	Env    []string
	Log    io.Writer
}

// startWorkload starts the stand-in through the launcher, so that it is in its
// container cgroup before it executes (the agent never sees it outside its pod).
func startWorkload(s launchSpec) (*workload, error) {
	return startCmd(s.Role, launcherCommand(s), s.Log)
}

// launcherCommand is the launcher's command for s: in a mount namespace of its own
// where s has mounts, dying with the driver.
func launcherCommand(s launchSpec) *exec.Cmd {
	args := []string{launcherCmd, "-cgroup-root", s.CgroupRoot, "-cgroup", s.Cgroup}
	if s.UID != os.Getuid() {
		args = append(args, "-uid", strconv.Itoa(s.UID))
	}
	for _, m := range s.Mounts {
		args = append(args, "-mount", m.String())
	}
	args = append(append(args, "--"), s.Argv...)
	cmd := exec.Command(s.Self, args...)
	cmd.Env = s.Env
	cmd.Stderr = s.Log
	// The stand-ins die with the driver, whatever happens to it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if len(s.Mounts) > 0 {
		// The launcher's mounts are its own and its stand-in's, never the host's.
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNS
	}
	return cmd
}

// startCmd starts cmd as a stand-in speaking the protocol on its stdin and stdout.
func startCmd(role string, cmd *exec.Cmd, log io.Writer) (*workload, error) {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", role, err)
	}
	w := &workload{role: role, cmd: cmd, stdin: stdin, events: make(chan event, 16), exited: make(chan struct{})}
	go w.read(stdout, log)
	return w, nil
}

// read decodes events until the stand-in's stdout closes, then reaps it.
func (w *workload) read(stdout io.Reader, log io.Writer) {
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil || ev.Event == "" {
			fmt.Fprintf(log, "%s stdout: %s\n", w.role, line) // not protocol: keep it as log
			continue
		}
		w.events <- ev
	}
	err := w.cmd.Wait()
	if err == nil {
		err = sc.Err()
	}
	w.err = fmt.Errorf("%s: %w (%v)", w.role, errWorkloadExited, err)
	close(w.exited)
}

func (w *workload) pid() int { return w.cmd.Process.Pid }

// send writes one command.
func (w *workload) send(c command) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := w.stdin.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("%s: sending %s: %w", w.role, c.Cmd, err)
	}
	return nil
}

// next waits for the next event of kind want (others are dropped, errors returned).
func (w *workload) next(ctx context.Context, want string, timeout time.Duration) (event, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case ev := <-w.events:
			switch ev.Event {
			case "error":
				return ev, fmt.Errorf("%s: %w: %s", w.role, errWorkloadFailed, ev.Error)
			case want:
				return ev, nil
			}
		case <-w.exited:
			// Drain what it said before exiting: an error event explains the exit.
			select {
			case ev := <-w.events:
				if ev.Event == "error" {
					return ev, fmt.Errorf("%s: %w: %s", w.role, errWorkloadFailed, ev.Error)
				}
			default:
			}
			return event{}, w.err
		case <-t.C:
			return event{}, fmt.Errorf("%s: no %q event within %v", w.role, want, timeout)
		case <-ctx.Done():
			return event{}, ctx.Err()
		}
	}
}

// waitReady waits for the stand-in's ready event (torch imported, CUDA context made,
// warmed up).
func (w *workload) waitReady(ctx context.Context, timeout time.Duration) error {
	ev, err := w.next(ctx, "ready", timeout)
	if err != nil {
		return err
	}
	w.ready = ev
	return nil
}

// quit asks the stand-in to exit and waits up to wait; then thaws (unfreeze, the caller's
// func) and kills it.
func (w *workload) quit(wait time.Duration, thaw func()) error {
	_ = w.send(command{Cmd: "quit"})
	_ = w.stdin.Close()
	select {
	case <-w.exited:
		return nil
	case <-time.After(wait):
	}
	if thaw != nil {
		thaw() // a frozen process handles no input, and a v1-frozen one does not die
	}
	_ = w.cmd.Process.Kill()
	select {
	case <-w.exited:
		return fmt.Errorf("%s did not exit within %v of quit; killed", w.role, wait)
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s did not exit after SIGKILL", w.role)
	}
}

// workloadArgv is the stand-in's command line.
func workloadArgv(o *options, role string) []string {
	if o.Fake {
		switch role {
		case roleLS:
			return []string{o.Self, fakeLSCmd, "-rate", fmt.Sprint(o.LSRate), "-work", o.FakeLSWork.String()}
		default:
			return []string{o.Self, fakeBatchCmd, "-every", fmt.Sprint(o.every(role)), "-work",
				o.FakeBatchWork.String()}
		}
	}
	switch role {
	case roleLS:
		return []string{o.Python, "-u", o.Workloads + "/ls.py", "--rate", fmt.Sprint(o.LSRate), "--matmuls",
			fmt.Sprint(o.LSMatmuls), "--size", fmt.Sprint(o.LSSize)}
	default:
		return []string{o.Python, "-u", o.Workloads + "/batch.py", "--size", fmt.Sprint(o.BatchSize), "--every",
			fmt.Sprint(o.every(role))}
	}
}

// envWith returns base with the NRI adjustments' variables set (replacing the same keys)
// and removed.
func envWith(base []string, set map[string]string, remove []string) []string {
	drop := map[string]bool{}
	for k := range set {
		drop[k] = true
	}
	for _, k := range remove {
		drop[k] = true
	}
	out := make([]string, 0, len(base)+len(set))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if !drop[k] {
			out = append(out, kv)
		}
	}
	for k, v := range set {
		out = append(out, k+"="+v)
	}
	return out
}

// baseEnv is the stand-ins' environment before NRI: the driver's, unbuffered Python.
func baseEnv() []string {
	return envWith(os.Environ(), map[string]string{"PYTHONUNBUFFERED": "1"}, nil)
}
