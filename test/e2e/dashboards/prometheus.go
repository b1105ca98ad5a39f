package dashboards

import (
	"bufio"
	"bytes"
	"context"
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

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"sigs.k8s.io/yaml"
)

// installScript prints the Prometheus binary's path, installing Debian's package
// when it is missing (relative to the module root).
const installScript = "scripts/prometheus.sh"

// ScrapeJob is one scrape_config of the test's Prometheus: static targets.
type ScrapeJob struct {
	Name string
	// Path is the metrics path; default /metrics.
	Path    string
	Targets []ScrapeTarget
}

// ScrapeTarget is one endpoint, host:port, with the labels Prometheus adds to its
// series (e.g. node, as the shipped scrape configuration relabels it).
type ScrapeTarget struct {
	Address string
	Labels  map[string]string
}

// PrometheusOptions tune StartPrometheus.
type PrometheusOptions struct {
	Jobs []ScrapeJob
	// ScrapeInterval is global.scrape_interval; default 1 s.
	ScrapeInterval time.Duration
	// Binary is the prometheus server; default: what scripts/prometheus.sh prints.
	Binary string
}

// Prometheus is a running throwaway Prometheus server owned by one test.
type Prometheus struct {
	url string
	api v1.API
	cmd *exec.Cmd
	log string
}

// URL is the server's base URL, http://127.0.0.1:<port>.
func (p *Prometheus) URL() string { return p.url }

// API is a client of its HTTP API.
func (p *Prometheus) API() v1.API { return p.api }

// promConfig is the subset of prometheus.yml the tests write.
type promConfig struct {
	Global struct {
		ScrapeInterval     string `json:"scrape_interval"`
		ScrapeTimeout      string `json:"scrape_timeout"`
		EvaluationInterval string `json:"evaluation_interval"`
	} `json:"global"`
	ScrapeConfigs []scrapeConfig `json:"scrape_configs"`
}

type scrapeConfig struct {
	JobName string `json:"job_name"`
	// HonorLabels keeps the targets' own namespace/pod/container labels (GPU pod
	// series) instead of renaming them exported_* when a target label of the same
	// name exists; dcgm-exporter is scraped the same way.
	HonorLabels   bool           `json:"honor_labels"`
	MetricsPath   string         `json:"metrics_path,omitempty"`
	StaticConfigs []staticConfig `json:"static_configs"`
}

type staticConfig struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels,omitempty"`
}

// config renders the scrape configuration.
func (o PrometheusOptions) config() ([]byte, error) {
	var c promConfig
	iv := o.ScrapeInterval
	if iv <= 0 {
		iv = time.Second
	}
	c.Global.ScrapeInterval = promDuration(iv)
	c.Global.ScrapeTimeout = promDuration(iv)
	c.Global.EvaluationInterval = promDuration(iv)
	for _, j := range o.Jobs {
		sc := scrapeConfig{JobName: j.Name, HonorLabels: true, MetricsPath: j.Path}
		for _, t := range j.Targets {
			sc.StaticConfigs = append(sc.StaticConfigs, staticConfig{Targets: []string{t.Address}, Labels: t.Labels})
		}
		c.ScrapeConfigs = append(c.ScrapeConfigs, sc)
	}
	return yaml.Marshal(c)
}

// startAttempts is how often the server is started on a fresh port when it exits
// during start-up (another process took the port between pick and bind).
const startAttempts = 3

// StartPrometheus runs a Prometheus server on a free loopback port with its data in
// a temp dir, scraping opts.Jobs, and waits until it is ready. It stops with the
// test (SIGTERM, then SIGKILL; it also dies with the test binary). Without a
// Prometheus binary it installs Debian's package (scripts/prometheus.sh); when
// that is impossible the test fails under CI=true and is skipped, with the reason,
// otherwise.
func StartPrometheus(ctx context.Context, tb testing.TB, opts PrometheusOptions) *Prometheus {
	tb.Helper()
	bin := opts.Binary
	if bin == "" {
		bin = FindPrometheus(tb)
	}
	cfg, err := opts.config()
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		tb.Fatal(err)
	}
	var lastErr error
	for attempt := range startAttempts {
		p, err := startOnce(ctx, tb, bin, cfgPath, dir, attempt)
		if err == nil {
			return p
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	tb.Fatalf("prometheus: %v", lastErr)
	return nil
}

func startOnce(ctx context.Context, tb testing.TB, bin, cfgPath, dir string, attempt int) (*Prometheus, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, fmt.Sprintf("prometheus-%d.log", attempt))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--storage.tsdb.retention.time=1d", "--log.level=info")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, and killed with the test binary even when no cleanup runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	}
	url := "http://" + addr
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-exited:
			return nil, fmt.Errorf("prometheus exited during start-up (%v); log:\n%s", err, tail(logPath, 20))
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if ready(url) {
			break
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("prometheus not ready within 60s; log:\n%s", tail(logPath, 20))
		}
	}
	client, err := api.NewClient(api.Config{Address: url})
	if err != nil {
		stop()
		return nil, err
	}
	p := &Prometheus{url: url, api: v1.NewAPI(client), cmd: cmd, log: logPath}
	tb.Cleanup(func() {
		stop()
		if tb.Failed() {
			tb.Logf("prometheus log %s, last lines:\n%s", logPath, tail(logPath, 30))
		}
	})
	return p, nil
}

func ready(url string) bool {
	resp, err := http.Get(url + "/-/ready")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// WaitTargetsUp waits until every active target has been scraped successfully.
func (p *Prometheus) WaitTargetsUp(ctx context.Context, want int) error {
	for {
		ts, err := p.api.Targets(ctx)
		if err == nil {
			up := 0
			var down []string
			for _, t := range ts.Active {
				if t.Health == v1.HealthGood {
					up++
				} else {
					down = append(down, fmt.Sprintf("%s %s: %s %s", t.ScrapePool, t.ScrapeURL, t.Health, t.LastError))
				}
			}
			if up >= want && len(down) == 0 {
				return nil
			}
			err = fmt.Errorf("%d of %d targets up: %s", up, want, strings.Join(down, "; "))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for scrape targets: %w (%w)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// FindPrometheus returns the Prometheus binary scripts/prometheus.sh prints
// (installing Debian's package when needed). When it fails the test fails under
// CI=true, and is skipped with the script's message otherwise: a missing
// dependency is never passed over silently.
func FindPrometheus(tb testing.TB) string {
	tb.Helper()
	root, err := ModuleRoot()
	if err != nil {
		tb.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(root, installScript))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := fmt.Sprintf("Prometheus server (Debian package prometheus) not available: %s: %v\n%s", installScript,
			err, strings.TrimSpace(stderr.String()))
		if os.Getenv("CI") == "true" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	bin := strings.TrimSpace(stdout.String())
	if bin == "" {
		tb.Fatalf("%s printed no path; stderr:\n%s", installScript, stderr.String())
	}
	return bin
}

// ModuleRoot returns the directory of go.mod above the working directory (go test
// runs in the package directory).
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory: %w", os.ErrNotExist)
		}
		dir = parent
	}
}

// freeAddr picks a free loopback port (another process may take it before the
// server binds it: StartPrometheus retries).
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// tail returns the last n lines of a file (or why it cannot).
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
