package gpureal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// agentProc is the agent (bin/koordlet) running in its no-cluster mode.
type agentProc struct {
	cmd    *exec.Cmd
	exited chan error
	addr   string
	log    string
	client *http.Client
}

// startAgent starts argv (the agent binary and its flags) with extra env, its output in
// logPath.
func startAgent(argv, env []string, addr, logPath string) (*agentProc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group; SIGTERM when the driver dies (the agent thaws what it froze).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting the agent %s: %w", argv[0], err)
	}
	a := &agentProc{cmd: cmd, exited: make(chan error, 1), addr: addr, log: logPath,
		client: &http.Client{Timeout: 2 * time.Second}}
	go func() { a.exited <- cmd.Wait(); f.Close() }()
	return a, nil
}

// errAgentExited: the agent stopped on its own.
var errAgentExited = errors.New("the agent exited")

// status reads /status as generic JSON: the bench reads only a few fields and records
// the GPU part as the agent wrote it.
func (a *agentProc) status() (map[string]any, error) {
	resp, err := a.client.Get("http://" + a.addr + "/status")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/status: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	var st map[string]any
	return st, json.Unmarshal(b, &st)
}

// profile saves a CPU profile of secs seconds from /debug/pprof/profile (the agent runs
// with -pprof) to path.
func (a *agentProc) profile(ctx context.Context, secs int, path string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(secs+10)*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", a.addr, secs), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/debug/pprof/profile: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return os.WriteFile(path, b, 0o644)
}

// waitPods waits until /status lists every pod of uids (the static source read the
// manifests), so that NRI finds every container's pod.
func (a *agentProc) waitPods(ctx context.Context, uids []string, timeout time.Duration) (map[string]any, error) {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		select {
		case err := <-a.exited:
			a.exited <- err
			return nil, fmt.Errorf("%w: %v; log %s:\n%s", errAgentExited, err, a.log, tailFile(a.log, 3000))
		default:
		}
		st, err := a.status()
		if err == nil {
			missing := missingPods(st, uids)
			if len(missing) == 0 {
				return st, nil
			}
			err = fmt.Errorf("the agent does not list pods %v yet", missing)
		}
		last = err
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the agent was not ready within %v: %w; log %s:\n%s", timeout, last, a.log,
				tailFile(a.log, 3000))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// missingPods returns the uids /status's pods (a map of class → list of entries with a
// "uid") do not list.
func missingPods(st map[string]any, uids []string) []string {
	pods, _ := st["pods"].(map[string]any)
	seen := map[string]bool{}
	for _, v := range pods {
		l, _ := v.([]any)
		for _, e := range l {
			if m, ok := e.(map[string]any); ok {
				if u, ok := m["uid"].(string); ok {
					seen[u] = true
				}
			}
		}
	}
	var out []string
	for _, u := range uids {
		if !seen[u] {
			out = append(out, u)
		}
	}
	return out
}

// stop sends SIGTERM (the agent thaws what it froze, stops an MPS daemon it started)
// and waits 15 s before killing its group.
func (a *agentProc) stop() error {
	select {
	case err := <-a.exited:
		a.exited <- err
		return fmt.Errorf("%w before the bench stopped it: %v", errAgentExited, err)
	default:
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-a.exited:
		a.exited <- err
		return err
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		err := <-a.exited
		a.exited <- err
		return errors.New("the agent did not stop within 15 s of SIGTERM; killed")
	}
}

// cpuSeconds is the process's user+system CPU (/proc/<pid>/stat, clock ticks of 10 ms,
// the Linux USER_HZ).
func cpuSeconds(procRoot string, pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/stat", procRoot, pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads utime+stime from a /proc/<pid>/stat line: the fields after the
// command name's closing parenthesis (which may itself hold spaces and parentheses).
func parseStatCPU(line string) (float64, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat line without a command name: %.60q", line)
	}
	f := strings.Fields(line[i+1:])
	// f[0] is the state (field 3); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("stat line with %d fields after the name, want ≥ 13", len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("stat utime/stime: %w", err)
	}
	const userHZ = 100
	return float64(ut+st) / userHZ, nil
}

// statusSample is one distinct GPU decision /status showed during a phase.
type statusSample struct {
	// Key is the decision's reason and lever fields (the figures that change every
	// step are left out).
	Key string `json:"key"`
	// FirstS is when it was first seen, seconds after the phase's start.
	FirstS float64 `json:"firstS"`
	Count  int     `json:"count"`
	// Example is the first /status GPU entry with it.
	Example json.RawMessage `json:"example"`
}

// decisionKey builds the key of one GPU entry of /status (gpu.gpus[i]): the decision
// fields that name a lever or a state, whichever of them the agent's /status has (the
// lever policy evolves), and how many LS and batch pods are on the GPU.
func decisionKey(gpu map[string]any) string {
	d, _ := gpu["decision"].(map[string]any)
	var parts []string
	for _, f := range [...]string{"reason", "lever", "mode", "frozen", "duty", "lsArrived", "mps", "lsCapPercent",
		"batchCapPercent", "protectedPercent"} {
		v, ok := d[f]
		if !ok {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s=%v", f, v))
	}
	for _, f := range []string{"lsPods", "batchPods"} {
		if l, ok := gpu[f].([]any); ok {
			parts = append(parts, fmt.Sprintf("%s=%d", f, len(l)))
		}
	}
	if len(parts) == 0 {
		return "no decision"
	}
	return strings.Join(parts, " ")
}

// sampler polls /status during a phase and keeps the distinct GPU decisions.
type sampler struct {
	mu      sync.Mutex
	start   time.Time
	samples map[string]*statusSample
	errs    int
}

// sample polls every period until ctx ends.
func (s *sampler) run(ctx context.Context, a *agentProc, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		st, err := a.status()
		s.add(st, err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *sampler) add(st map[string]any, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.samples == nil {
		s.samples = map[string]*statusSample{}
	}
	if err != nil {
		s.errs++
		return
	}
	g, _ := st["gpu"].(map[string]any)
	gpus, _ := g["gpus"].([]any)
	// The agent's CPU escalation freezes the whole batch tier: not a GPU lever, but it
	// stops batch all the same, so it shows in the key.
	esc, _ := st["escalation"].(map[string]any)
	cpuFreeze := esc["freeze"] == true
	for _, x := range gpus {
		gpu, ok := x.(map[string]any)
		if !ok {
			continue
		}
		k := decisionKey(gpu)
		if cpuFreeze {
			k += " cpuFreeze=true"
		}
		if e := s.samples[k]; e != nil {
			e.Count++
			continue
		}
		ex, _ := json.Marshal(gpu)
		s.samples[k] = &statusSample{Key: k, FirstS: time.Since(s.start).Seconds(), Count: 1, Example: ex}
	}
}

// result returns the decisions, most seen first.
func (s *sampler) result() []statusSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]statusSample, 0, len(s.samples))
	for _, v := range s.samples {
		out = append(out, *v)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].FirstS < out[j].FirstS
	})
	return out
}

// freeAddr is a free loopback address for the agent's HTTP server.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// tailFile returns the last max bytes of a file.
func tailFile(path string, max int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}
