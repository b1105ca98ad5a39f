package colo

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet"
	"github.com/understory/understory/koordlet/config"
)

// agentProc is a koordlet started by the scenario, as a separate process so that its
// CPU and memory can be measured like a DaemonSet pod's.
type agentProc struct {
	cmd  *exec.Cmd
	addr string
	log  string
}

// startAgent runs koordlet on the fake node with the given policy threshold and period.
func (s *scenario) startAgent(threshold float64, period time.Duration) (*agentProc, error) {
	cfg := config.Default()
	cfg.KubeletCgroupRoot = "/" + s.base
	cfg.CgroupRoot = s.cfg.cgroupRoot
	cfg.StaticPodDir = filepath.Join(s.dir, "manifests")
	cfg.Policy.Threshold = threshold
	cfg.Period.Duration = period
	cfg.TierParent = s.tierParent
	if s.memThreshold > 0 {
		cfg.BatchResources.Memory.Threshold = s.memThreshold
	}
	if s.cfg.cfsPeriod > 0 {
		cfg.CFSPeriod.Duration = s.cfg.cfsPeriod
		cfg.MinPodCPU = max(cfg.MinPodCPU, float64(time.Millisecond)/float64(s.cfg.cfsPeriod))
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cfg.ListenAddress = addr
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	if s.signalsMode != "" {
		if b, err = withSignalsMode(b, s.signalsMode); err != nil {
			return nil, err
		}
		// The agent and this binary are built from one tree (`make build`): a mode
		// its configuration does not know is refused here, with a sentinel the
		// variant runs branch on, rather than as an agent that never got healthy.
		if _, err := config.Load(b); err != nil {
			return nil, fmt.Errorf("signals.mode %q: %w: %v", s.signalsMode, errSignalsRejected, err)
		}
	}
	cfgPath := filepath.Join(s.dir, "koordlet.yaml")
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		return nil, err
	}
	// Every agent phase starts as on a fresh node: the tier's CFS limit the previous
	// phase's agent left (its shutdown budget) is lifted, since a restarted agent with a
	// harm signal continues from the limit it finds (qos.Guard.StartFrom). What a
	// restart costs is not what the phases measure.
	if tg, err := s.hier.Load(s.tier()); err == nil {
		if err := tg.SetCPULimit(cgroups.Unlimited, 100*time.Millisecond); err != nil {
			return nil, fmt.Errorf("lifting the tier's leftover CPU limit: %w", err)
		}
	}
	logPath := filepath.Join(s.dir, fmt.Sprintf("koordlet-%d.log", time.Now().UnixNano()))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	args := []string{"-config", cfgPath}
	if s.cfg.agentPprof {
		args = append(args, "-pprof")
	}
	cmd := exec.Command(s.cfg.koordlet, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := startDefaultSlice(cmd); err != nil {
		return nil, fmt.Errorf("starting %s (build it with `make build`): %w", s.cfg.koordlet, err)
	}
	a := &agentProc{cmd: cmd, addr: cfg.ListenAddress, log: logPath}
	s.agent = a
	if err := a.waitHealthy(15 * time.Second); err != nil {
		_ = a.stop()
		s.agent = nil
		return nil, fmt.Errorf("%w; agent log:\n%s", err, tail(logPath, 20))
	}
	return a, nil
}

func (a *agentProc) waitHealthy(d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + a.addr + "/healthz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if a.cmd.ProcessState != nil {
			return errors.New("the agent exited")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("the agent was not healthy within %v", d)
}

// status fetches the agent's /status.
func (a *agentProc) status() (koordlet.Status, error) {
	var st koordlet.Status
	resp, err := http.Get("http://" + a.addr + "/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// stop asks the agent to shut down gracefully and waits for it.
func (a *agentProc) stop() error {
	if a.cmd.Process == nil {
		return nil
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- a.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		return <-done
	}
}

func (s *scenario) stopAgent() error {
	if s.agent == nil {
		return nil
	}
	err := s.agent.stop()
	s.agent = nil
	return err
}

func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	n := 0
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '\n' {
			n++
			if n > lines {
				return string(b[i+1:])
			}
		}
	}
	return string(b)
}
