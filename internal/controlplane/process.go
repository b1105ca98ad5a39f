package controlplane

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// stopGrace is how long a process gets between SIGTERM and SIGKILL.
const stopGrace = 3 * time.Second

// groupGoneTimeout bounds the wait for orphaned group members to be reaped
// after SIGKILL (they are init's children then, so we cannot wait on them).
const groupGoneTimeout = 5 * time.Second

// process is one server run in its own process group, logging to a file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	grace   time.Duration // SIGTERM -> SIGKILL
	done    chan struct{} // closed when cmd.Wait returned
	waitErr error         // valid after done is closed

	stopOnce sync.Once
}

// startProcess starts bin with args in a new process group. Output goes to
// logPath (appended, so retries keep the earlier attempts' output). The
// environment is the test's, minus ETCD_* variables that etcd would read.
func startProcess(name, logPath, bin string, args []string) (*process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening %s log: %w", name, err)
	}
	fmt.Fprintf(f, "=== %s %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.Env = cleanEnv(os.Environ())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, grace: stopGrace, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func cleanEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if strings.HasPrefix(kv, "ETCD_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// exited reports whether the process has exited, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.waitErr
	default:
		return false, nil
	}
}

// stop terminates the whole process group (SIGTERM, then SIGKILL after
// p.grace) and waits for the leader. Safe to call more than once.
func (p *process) stop() {
	p.stopOnce.Do(func() {
		pgid := p.cmd.Process.Pid
		if ok, _ := p.exited(); !ok {
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(p.grace):
			}
		}
		// Kill what is left of the group, even if the leader is gone, and
		// wait (bounded) until its members are gone or reaped.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
		for deadline := time.Now().Add(groupGoneTimeout); time.Now().Before(deadline); {
			if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// tail returns the last n lines of the process log.
func (p *process) tail(n int) string { return TailFile(p.logPath, n) }

// TailFile is the last n lines of the file at path, or why it cannot be read: for the
// logs tests print when they fail.
func TailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", path, err)
	}
	return TailLines(string(b), n)
}

// errExited is returned while waiting for a process that exited.
var errExited = errors.New("process exited during start-up")

// waitReady polls ready until it returns nil, the process exits, or timeout.
func (p *process) waitReady(timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	lastErr := errors.New("not probed yet")
	for {
		if ok, werr := p.exited(); ok {
			return fmt.Errorf("%s (%v; last probe: %v): %w", p.name, werr, lastErr, errExited)
		}
		if lastErr = ready(); lastErr == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %w", p.name, timeout, lastErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// dumpOnFailure registers a cleanup that logs the tail of every process log
// if the test failed. Register it before the processes' own stop cleanups so
// it runs after them (cleanups are LIFO) and shows their last words.
func dumpOnFailure(t testing.TB, procs func() []*process) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, p := range procs() {
			t.Logf("----- last lines of %s (%s) -----\n%s", p.name, p.logPath, p.tail(60))
		}
	})
}

// freePorts returns n distinct loopback TCP ports that were free a moment
// ago. All listeners are open at once so the ports differ.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// servedComponent is a control-plane component (kube-scheduler,
// kube-controller-manager) that serves https on loopback with a certificate
// from the harness's CA, for startServed.
type servedComponent struct {
	label     string // error and log prefix, e.g. "kube-scheduler"
	procName  string // process name, e.g. "kube-scheduler-1"
	bin       string
	logFile   string // under cp.dir
	certStem  string // serving certificate and key: certStem.crt, certStem.key under cp.dir
	readyPath string // probed until 200, e.g. "/readyz"
	// args is the command line of one attempt serving on port with certFile and keyFile.
	args func(port int, certFile, keyFile string) []string
}

// startServed issues c's serving certificate, starts c on a free loopback
// port and waits until readyPath answers 200. When the process exits during
// start-up (its port taken in the meantime) it retries on a fresh port, up to
// startAttempts times; any other failure fails the test. It returns the
// running process (tracked for cleanup) and its https base URL.
func (cp *ControlPlane) startServed(t testing.TB, c servedComponent) (*process, string) {
	t.Helper()
	certPEM, keyPEM, err := cp.pki.issue(certRequest{
		commonName: c.label, dnsNames: []string{"localhost"},
		ips: []net.IP{net.IPv4(127, 0, 0, 1)}, server: true,
	})
	if err != nil {
		t.Fatalf("%s: %v", c.label, err)
	}
	certFile, keyFile := cp.path(c.certStem+".crt"), cp.path(c.certStem+".key")
	if err := writeFiles(map[string][]byte{certFile: certPEM, keyFile: keyPEM}); err != nil {
		t.Fatalf("%s: %v", c.label, err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cp.pki.cert)
	hc := &http.Client{
		Timeout:   3 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}
	defer hc.CloseIdleConnections()

	var lastErr error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		ports, err := freePorts(1)
		if err != nil {
			t.Fatalf("%s: %v", c.label, err)
		}
		url := "https://" + hostPort(ports[0])
		p, err := startProcess(c.procName, cp.path(c.logFile), c.bin, c.args(ports[0], certFile, keyFile))
		if err != nil {
			t.Fatalf("%s: %v", c.label, err)
		}
		cp.track(t, p)
		lastErr = p.waitReady(cp.opts.StartTimeout, func() error { return httpOK(hc, url+c.readyPath) })
		if lastErr == nil {
			return p, url
		}
		p.stop()
		if !errors.Is(lastErr, errExited) {
			break
		}
		t.Logf("%s attempt %d: %v; retrying on a fresh port", c.label, attempt, lastErr)
	}
	t.Fatalf("%s: %v", c.label, lastErr)
	return nil, ""
}

func httpOK(hc *http.Client, url string) error {
	resp, err := hc.Get(url)
	if err != nil {
		return fmt.Errorf("probing %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}
