package realnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/understory/understory/koordlet"
)

// buildAgent builds cmd/koordlet, the real agent binary, into a temp dir.
func buildAgent(t *testing.T, repo string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "koordlet")
	start := time.Now()
	cmd := exec.Command("nice", "-n", "10", "go", "build", "-o", out, "./cmd/koordlet")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/koordlet: %v\n%s", err, b)
	}
	t.Logf("built the agent in %v", time.Since(start).Round(time.Millisecond))
	return out
}

// agentProc is one run of the agent binary in Kubernetes mode against the node.
type agentProc struct {
	name    string
	cmd     *exec.Cmd
	url     string
	logPath string
	done    chan error
	stopped bool
}

// startAgent writes a config (nri on or off) and starts the agent with -kubeconfig
// and -node-name; it returns once /healthz answers. The process is stopped at cleanup.
func startAgent(t *testing.T, bin string, n *node, name string, nri bool) *agentProc {
	t.Helper()
	addr, err := freeAddr()
	if err != nil {
		t.Fatalf("agent port: %v", err)
	}
	cfg := fmt.Sprintf("cgroupDriver: cgroupfs\nnodeMetricsPeriod: 2s\nnodeMetricsReport: {maxInterval: 10s}\nnri:\n  enabled: %t\n  socket: %s\n", nri, n.env["NRI_SOCKET"])
	cfgPath := filepath.Join(n.dir, "koordlet-"+name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatalf("agent config: %v", err)
	}
	logPath := filepath.Join(n.dir, "logs", "koordlet-"+name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("agent log: %v", err)
	}
	cmd := exec.Command(bin, "-config", cfgPath, "-kubeconfig", n.env["KUBECONFIG"], "-node-name", n.env["NODE_NAME"],
		"-listen", addr, "-log-level", "debug")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		t.Fatalf("starting agent: %v", err)
	}
	a := &agentProc{name: name, cmd: cmd, url: "http://" + addr, logPath: logPath, done: make(chan error, 1)}
	go func() { a.done <- cmd.Wait(); _ = logf.Close() }()
	t.Cleanup(func() {
		if err := a.stop(); err != nil && !a.stopped {
			t.Errorf("agent %s: %v", name, err)
		}
		if t.Failed() {
			t.Logf("agent %s log tail:\n%s", name, a.logTail(30))
		}
	})
	start := time.Now()
	err = poll(context.Background(), 30*time.Second, func() (bool, error) {
		select {
		case err := <-a.done:
			a.done <- err
			return false, fmt.Errorf("agent exited: %v", err)
		default:
		}
		resp, err := http.Get(a.url + "/healthz")
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("agent %s not healthy: %v\n%s", name, err, a.logTail(30))
	}
	t.Logf("agent %s (nri=%t) healthy in %v", name, nri, time.Since(start).Round(time.Millisecond))
	return a
}

// stop sends SIGTERM (graceful shutdown: the agent leaves batch bounded) and waits.
func (a *agentProc) stop() error {
	if a.stopped {
		return nil
	}
	a.stopped = true
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-a.done:
		if err != nil {
			return fmt.Errorf("agent exit: %w", err)
		}
		return nil
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		<-a.done
		return errors.New("agent ignored SIGTERM for 15s; killed")
	}
}

// status fetches /status.
func (a *agentProc) status(ctx context.Context) (koordlet.Status, error) {
	var s koordlet.Status
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url+"/status", nil)
	if err != nil {
		return s, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return s, fmt.Errorf("GET /status: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("GET /status: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return s, fmt.Errorf("decoding /status: %w", err)
	}
	return s, nil
}

// podEntry finds a pod in a /status snapshot, with its class.
func podEntry(s koordlet.Status, name string) (koordlet.PodEntry, string, bool) {
	for class, pods := range s.Pods {
		for _, p := range pods {
			if p.Name == name {
				return p, class, true
			}
		}
	}
	return koordlet.PodEntry{}, "", false
}

// logLines returns the agent log lines containing every needle.
func (a *agentProc) logLines(needles ...string) []string {
	data, _ := os.ReadFile(a.logPath)
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		ok := l != ""
		for _, s := range needles {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

func (a *agentProc) logTail(n int) string {
	data, _ := os.ReadFile(a.logPath)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freeAddr returns a loopback address with a port free right now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
