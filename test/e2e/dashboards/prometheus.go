package dashboards

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/cmd/dashboard-render/grafana"
	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/testenv"
)

// installScript prints the Prometheus binary's path, installing Debian's package
// when it is missing (relative to the module root).
const installScript = "scripts/prometheus.sh"

// ScrapeJob is one scrape_config of the test's Prometheus: static targets.
type ScrapeJob struct {
	Name string
	// Path is the metrics path; default /metrics.
	Path string
	// Scheme is http (default) or https.
	Scheme string
	// TLS is an https job's tls_config; nil: the system's CAs, the target's host as
	// the server name, no client certificate.
	TLS *TLSConfig
	// BearerTokenFile, when set, is sent as "Authorization: Bearer <its content>" on
	// every scrape (authorization.credentials_file; re-read on each scrape), as a
	// Prometheus in a pod sends its service account's token. An absolute path.
	BearerTokenFile string
	Targets         []ScrapeTarget
}

// TLSConfig is a scrape job's tls_config. Paths must be absolute: Prometheus reads
// relative ones from the directory of its configuration file, a temp dir here.
type TLSConfig struct {
	// CAFile verifies the target's serving certificate.
	CAFile string
	// ServerName is checked against the serving certificate (and sent as SNI) instead of
	// the target's address: a pod scraped at its IP presents its Service's name.
	ServerName string
	// CertFile and KeyFile are a client certificate, both or neither.
	CertFile, KeyFile string
	// InsecureSkipVerify accepts any serving certificate: kube-scheduler's is
	// self-signed in memory when it starts, so no CA verifies it (the shipped
	// ServiceMonitor and scrape job skip verification too). Not with CAFile.
	InsecureSkipVerify bool
}

// ScrapeTarget is one endpoint, host:port, with the labels Prometheus adds to its
// series (e.g. node, as the shipped scrape configuration relabels it).
type ScrapeTarget struct {
	Address string
	Labels  map[string]string
}

// ErrScrapeConfig marks scrape jobs Prometheus would refuse (or misread).
var ErrScrapeConfig = errors.New("invalid scrape configuration")

// validate checks what Prometheus would refuse at load, or read otherwise than meant.
func (j ScrapeJob) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("scrape job %q: %s: %w", j.Name, fmt.Sprintf(format, a...), ErrScrapeConfig)
	}
	if j.Name == "" {
		return bad("no name")
	}
	switch j.Scheme {
	case "", "http", "https":
	default:
		return bad("scheme %q, want http or https", j.Scheme)
	}
	if j.Path != "" && !strings.HasPrefix(j.Path, "/") {
		return bad("metrics path %q does not start with /", j.Path)
	}
	if t := j.TLS; t != nil {
		if j.Scheme != "https" {
			return bad("TLS settings need scheme https, not %q", j.Scheme)
		}
		if t.InsecureSkipVerify && (t.CAFile != "" || t.ServerName != "") {
			return bad("TLS: a CA file or server name with verification off")
		}
		if (t.CertFile == "") != (t.KeyFile == "") {
			return bad("client certificate %q and key %q: both or neither", t.CertFile, t.KeyFile)
		}
		for _, f := range []string{t.CAFile, t.CertFile, t.KeyFile} {
			if f != "" && !filepath.IsAbs(f) {
				return bad("TLS file %q is not an absolute path", f)
			}
		}
	}
	if f := j.BearerTokenFile; f != "" && !filepath.IsAbs(f) {
		return bad("bearer token file %q is not an absolute path", f)
	}
	for _, t := range j.Targets {
		if host, port, err := net.SplitHostPort(t.Address); err != nil || host == "" || port == "" {
			return bad("target %q is not host:port", t.Address)
		}
	}
	return nil
}

// PrometheusOptions tune StartPrometheus and Launch.
type PrometheusOptions struct {
	Jobs []ScrapeJob
	// ScrapeInterval is global.scrape_interval (and the scrape timeout); default 1 s.
	ScrapeInterval time.Duration
	// Binary is the prometheus server; default: what scripts/prometheus.sh prints.
	Binary string
}

// Prometheus is a running throwaway Prometheus server.
type Prometheus struct {
	url      string
	api      v1.API
	cfgPath  string
	log      string
	interval time.Duration
	stop     func()
	mu       sync.Mutex // serialises SetJobs
}

// URL is the server's base URL, http://127.0.0.1:<port>.
func (p *Prometheus) URL() string { return p.url }

// API is a client of its HTTP API.
func (p *Prometheus) API() v1.API { return p.api }

// Stop ends the server (SIGTERM, SIGKILL after 10 s) and waits for it; it may be
// called more than once.
func (p *Prometheus) Stop() { p.stop() }

// LogTail returns the last n lines of the server's log.
func (p *Prometheus) LogTail(n int) string { return controlplane.TailFile(p.log, n) }

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
	Scheme        string         `json:"scheme,omitempty"`
	TLSConfig     *tlsConfig     `json:"tls_config,omitempty"`
	Authorization *authorization `json:"authorization,omitempty"`
	StaticConfigs []staticConfig `json:"static_configs"`
}

// authorization is a scrape job's Authorization header: type Bearer (Prometheus'
// default) with the credentials read from a file.
type authorization struct {
	CredentialsFile string `json:"credentials_file"`
}

type tlsConfig struct {
	CAFile     string `json:"ca_file,omitempty"`
	CertFile   string `json:"cert_file,omitempty"`
	KeyFile    string `json:"key_file,omitempty"`
	ServerName string `json:"server_name,omitempty"`
	Insecure   bool   `json:"insecure_skip_verify,omitempty"`
}

type staticConfig struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels,omitempty"`
}

// config renders the scrape configuration, or says why Prometheus would refuse it.
func (o PrometheusOptions) config() ([]byte, error) {
	var c promConfig
	iv := o.ScrapeInterval
	if iv <= 0 {
		iv = time.Second
	}
	c.Global.ScrapeInterval = grafana.PromDuration(iv)
	c.Global.ScrapeTimeout = grafana.PromDuration(iv)
	c.Global.EvaluationInterval = grafana.PromDuration(iv)
	names := map[string]bool{}
	for _, j := range o.Jobs {
		if err := j.validate(); err != nil {
			return nil, err
		}
		if names[j.Name] {
			return nil, fmt.Errorf("scrape job %q twice: %w", j.Name, ErrScrapeConfig)
		}
		names[j.Name] = true
		sc := scrapeConfig{JobName: j.Name, HonorLabels: true, MetricsPath: j.Path, Scheme: j.Scheme}
		if t := j.TLS; t != nil {
			sc.TLSConfig = &tlsConfig{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile,
				ServerName: t.ServerName, Insecure: t.InsecureSkipVerify}
		}
		if j.BearerTokenFile != "" {
			sc.Authorization = &authorization{CredentialsFile: j.BearerTokenFile}
		}
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
	if _, err := opts.config(); err != nil {
		tb.Fatal(err)
	}
	if opts.Binary == "" {
		opts.Binary = FindPrometheus(tb)
	}
	p, err := Launch(ctx, opts, tb.TempDir())
	if err != nil {
		tb.Fatalf("prometheus: %v", err)
	}
	tb.Cleanup(func() {
		p.Stop()
		if tb.Failed() {
			tb.Logf("prometheus log %s, last lines:\n%s", p.log, p.LogTail(30))
		}
	})
	return p
}

// Launch is StartPrometheus for a server that outlives the (sub)test that starts
// it: its configuration, data and log go to dir, errors are returned, and the
// caller stops it (Stop) before dir is removed. It dies with the test binary.
// Without opts.Binary it runs scripts/prometheus.sh, and fails when that does.
func Launch(ctx context.Context, opts PrometheusOptions, dir string) (*Prometheus, error) {
	cfg, err := opts.config()
	if err != nil {
		return nil, err
	}
	bin := opts.Binary
	if bin == "" {
		if bin, err = findPrometheus(); err != nil {
			return nil, err
		}
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := range startAttempts {
		p, err := startOnce(ctx, bin, cfgPath, dir, attempt)
		if err == nil {
			p.interval = opts.ScrapeInterval
			return p, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

func startOnce(ctx context.Context, bin, cfgPath, dir string, attempt int) (*Prometheus, error) {
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
	// --web.enable-lifecycle: SetJobs reloads through POST /-/reload, which answers
	// with the reload's outcome (SIGHUP would not).
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--storage.tsdb.retention.time=1d", "--log.level=info",
		"--web.enable-lifecycle")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, and killed with the test binary even when no cleanup runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := sync.OnceFunc(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})
	url := "http://" + addr
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-exited:
			return nil, fmt.Errorf("prometheus exited during start-up (%v); log:\n%s", err, controlplane.TailFile(logPath, 20))
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
			return nil, fmt.Errorf("prometheus not ready within 60s; log:\n%s", controlplane.TailFile(logPath, 20))
		}
	}
	client, err := api.NewClient(api.Config{Address: url})
	if err != nil {
		stop()
		return nil, err
	}
	return &Prometheus{url: url, api: v1.NewAPI(client), cfgPath: cfgPath, log: logPath, stop: stop}, nil
}

// SetJobs replaces the scrape jobs and reloads the server's configuration, e.g. to
// follow a target whose address changed. Series scraped so far stay; a target no
// longer listed gets staleness markers; new targets are scraped within a few
// seconds (Prometheus' discovery manager passes on updates every 5 s). When
// Prometheus refuses the configuration it keeps the old one, and so does its file.
func (p *Prometheus) SetJobs(ctx context.Context, jobs []ScrapeJob) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	cfg, err := PrometheusOptions{Jobs: jobs, ScrapeInterval: p.interval}.config()
	if err != nil {
		return err
	}
	old, err := os.ReadFile(p.cfgPath)
	if err != nil {
		return err
	}
	if err := writeAtomic(p.cfgPath, cfg); err != nil {
		return err
	}
	if err := p.reload(ctx); err != nil {
		if werr := writeAtomic(p.cfgPath, old); werr != nil {
			err = errors.Join(err, fmt.Errorf("restoring %s: %w", p.cfgPath, werr))
		}
		return err
	}
	return nil
}

// ErrReload means Prometheus refused to reload its configuration.
var ErrReload = errors.New("prometheus refused the configuration")

// reload asks Prometheus to re-read its configuration file and waits for the outcome.
func (p *Prometheus) reload(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"/-/reload", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("reloading the configuration: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST /-/reload: %s: %s: %w", resp.Status, strings.TrimSpace(string(body)), ErrReload)
	}
	return nil
}

// writeAtomic replaces path with data through a rename: Prometheus never reads half a file.
func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
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

// WaitScrapedAfter waits until every active target has a scrape that began after since
// stored, so that a query up to now sees the state at since. A target's last scrape time
// moves when the scrape is reported, which may be before its samples are stored; the
// scrape after it starts once they are: so it waits for a target's first scrape after
// since and then for one more.
func (p *Prometheus) WaitScrapedAfter(ctx context.Context, since time.Time) error {
	first := map[string]time.Time{} // by scrape URL: its first scrape after since
	for {
		ts, err := p.api.Targets(ctx)
		if err == nil {
			var waiting []string
			for _, t := range ts.Active {
				f, ok := first[t.ScrapeURL]
				switch {
				case !ok && t.LastScrape.After(since):
					first[t.ScrapeURL] = t.LastScrape
					waiting = append(waiting, t.ScrapeURL+" (one more scrape)")
				case !ok:
					waiting = append(waiting, fmt.Sprintf("%s (last scrape %v)", t.ScrapeURL, t.LastScrape))
				case !t.LastScrape.After(f):
					waiting = append(waiting, t.ScrapeURL+" (one more scrape)")
				}
			}
			if len(ts.Active) > 0 && len(waiting) == 0 {
				return nil
			}
			err = fmt.Errorf("no active target, or not yet scraped after %v: %s", since.Format(time.RFC3339Nano),
				strings.Join(waiting, "; "))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for scrapes: %w (%w)", ctx.Err(), err)
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
	bin, err := findPrometheus()
	if err != nil {
		testenv.SkipOrFailInCI(tb, "%v", err)
	}
	return bin
}

// findPrometheus runs scripts/prometheus.sh.
func findPrometheus() (string, error) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(root, installScript))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("Prometheus server (Debian package prometheus) not available: %s: %w\n%s", installScript,
			err, strings.TrimSpace(stderr.String()))
	}
	bin := strings.TrimSpace(stdout.String())
	if bin == "" {
		return "", fmt.Errorf("%s printed no path; stderr:\n%s", installScript, stderr.String())
	}
	return bin, nil
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
