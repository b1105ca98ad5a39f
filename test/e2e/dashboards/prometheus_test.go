package dashboards

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/understory/understory/internal/testenv"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/scrape-config/*.yaml from the rendered configurations")

// TestConfigRender compares the rendered prometheus.yml with testdata/scrape-config
// (go test -run TestConfigRender -update rewrites them).
func TestConfigRender(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts PrometheusOptions
	}{
		{"empty", PrometheusOptions{}},
		{"http", PrometheusOptions{ScrapeInterval: 2 * time.Second, Jobs: []ScrapeJob{{
			Name: "understory-koordlet",
			Targets: []ScrapeTarget{
				{Address: "10.88.0.5:9316", Labels: map[string]string{"node": "n1", "pod": "understory-koordlet-abc"}},
				{Address: "10.88.0.9:9316"},
			},
		}}}},
		{"https-ca-server-name", PrometheusOptions{ScrapeInterval: 1500 * time.Millisecond, Jobs: []ScrapeJob{{
			Name: "understory-scheduler-extender", Scheme: "https", Path: "/metrics",
			TLS:     &TLSConfig{CAFile: "/certs/ca.crt", ServerName: "understory-scheduler-extender.understory-system.svc"},
			Targets: []ScrapeTarget{{Address: "10.88.0.7:8888"}},
		}}}},
		{"https-client-certificate", PrometheusOptions{Jobs: []ScrapeJob{
			{Name: "plain", Targets: []ScrapeTarget{{Address: "127.0.0.1:1"}}},
			{Name: "mtls", Scheme: "https", TLS: &TLSConfig{CAFile: "/certs/ca.crt", ServerName: "x.svc",
				CertFile: "/certs/client.crt", KeyFile: "/certs/client.key"},
				Targets: []ScrapeTarget{{Address: "[::1]:8888"}}},
			{Name: "system-roots", Scheme: "https", Targets: []ScrapeTarget{{Address: "example.org:443"}}},
		}}},
		{"https-bearer-token", PrometheusOptions{Jobs: []ScrapeJob{{
			Name: "understory-scheduler", Scheme: "https", TLS: &TLSConfig{CAFile: "/certs/ca.crt"},
			BearerTokenFile: "/secrets/token", Targets: []ScrapeTarget{{Address: "127.0.0.1:10259"}},
		}}}},
		{"https-bearer-token-self-signed", PrometheusOptions{Jobs: []ScrapeJob{{
			Name: "understory-scheduler", Scheme: "https", TLS: &TLSConfig{InsecureSkipVerify: true},
			BearerTokenFile: "/secrets/token", Targets: []ScrapeTarget{{Address: "10.88.0.4:10259"}},
		}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := tc.opts.config()
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "scrape-config", tc.name+".yaml")
			if *updateGolden {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test -run TestConfigRender -update writes it)", err)
			}
			if string(got) != string(want) {
				t.Errorf("rendered configuration differs from %s:\n--- got\n%s--- want\n%s", path, got, want)
			}
		})
	}
}

// TestConfigRejects: what Prometheus would refuse, or read otherwise than meant, is
// an error naming the job, before any server starts.
func TestConfigRejects(t *testing.T) {
	t.Parallel()
	tgt := []ScrapeTarget{{Address: "127.0.0.1:9316"}}
	for _, tc := range []struct {
		name string
		jobs []ScrapeJob
		want string
	}{
		{"no name", []ScrapeJob{{Targets: tgt}}, "no name"},
		{"twice", []ScrapeJob{{Name: "a", Targets: tgt}, {Name: "a", Targets: tgt}}, `"a" twice`},
		{"scheme", []ScrapeJob{{Name: "a", Scheme: "HTTPS", Targets: tgt}}, `scheme "HTTPS"`},
		{"tls over http", []ScrapeJob{{Name: "a", TLS: &TLSConfig{CAFile: "/ca.crt"}, Targets: tgt}},
			"TLS settings need scheme https"},
		{"cert without key", []ScrapeJob{{Name: "a", Scheme: "https", TLS: &TLSConfig{CertFile: "/c.crt"},
			Targets: tgt}}, "both or neither"},
		{"key without cert", []ScrapeJob{{Name: "a", Scheme: "https", TLS: &TLSConfig{KeyFile: "/c.key"},
			Targets: tgt}}, "both or neither"},
		{"relative ca", []ScrapeJob{{Name: "a", Scheme: "https", TLS: &TLSConfig{CAFile: "certs/ca.crt"},
			Targets: tgt}}, "not an absolute path"},
		{"insecure with a CA", []ScrapeJob{{Name: "a", Scheme: "https", TLS: &TLSConfig{CAFile: "/ca.crt",
			InsecureSkipVerify: true}, Targets: tgt}}, "verification off"},
		{"relative token", []ScrapeJob{{Name: "a", BearerTokenFile: "token", Targets: tgt}}, "not an absolute path"},
		{"path", []ScrapeJob{{Name: "a", Path: "metrics", Targets: tgt}}, "does not start with /"},
		{"no port", []ScrapeJob{{Name: "a", Targets: []ScrapeTarget{{Address: "10.0.0.1"}}}}, "not host:port"},
		{"url as address", []ScrapeJob{{Name: "a", Targets: []ScrapeTarget{{Address: "http://10.0.0.1:80/metrics"}}}},
			"not host:port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := PrometheusOptions{Jobs: tc.jobs}.config()
			if !errors.Is(err, ErrScrapeConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("config() = %v, want ErrScrapeConfig saying %q", err, tc.want)
			}
		})
	}
}

// testPKI is a throwaway CA with a serving certificate for serverName and a client
// certificate, written as PEM files to a temp dir.
type testPKI struct {
	dir    string
	pool   *x509.CertPool
	server tls.Certificate
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64
}

func newTestPKI(t *testing.T, serverName string) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{dir: t.TempDir(), pool: x509.NewCertPool(), ca: ca, caKey: key, serial: 1}
	p.pool.AddCert(ca)
	writePEM(t, filepath.Join(p.dir, "ca.crt"), "CERTIFICATE", der)
	p.server = p.issue(t, "server", serverName, x509.ExtKeyUsageServerAuth)
	p.issue(t, "client", "", x509.ExtKeyUsageClientAuth)
	return p
}

// issue signs a leaf certificate and writes <name>.crt and <name>.key.
func (p *testPKI) issue(t *testing.T, name, dns string, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	if dns != "" {
		tmpl.DNSNames = []string{dns}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(p.dir, name+".crt"), "CERTIFICATE", der)
	writePEM(t, filepath.Join(p.dir, name+".key"), "EC PRIVATE KEY", kb)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (p *testPKI) file(name string) string { return filepath.Join(p.dir, name) }

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// metricsServer serves one gauge, test_up{server="name"} 1, over TLS with p's
// serving certificate; with clientAuth it refuses a caller without a client
// certificate p signed.
func metricsServer(t *testing.T, p *testPKI, name string, clientAuth bool) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, "# TYPE test_up gauge\ntest_up{server=%q} 1\n", name)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{p.server}, MinVersion: tls.VersionTLS12}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are the point
	if clientAuth {
		srv.TLS.ClientAuth, srv.TLS.ClientCAs = tls.RequireAndVerifyClientCert, p.pool
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "https://")
}

// TestConfigTLSScrape: a real Prometheus scrapes HTTPS targets with the rendered
// tls_config: the CA and the server name verify the serving certificate (issued
// for a name, scraped at an IP, as a pod is), and the client certificate gets past
// a server that requires one. A wrong server name fails the scrape.
func TestConfigTLSScrape(t *testing.T) {
	t.Parallel()
	const name = "metrics.understory.test"
	p := newTestPKI(t, name)
	open := metricsServer(t, p, "open", false)
	mtls := metricsServer(t, p, "mtls", true)
	bin := FindPrometheus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	caOnly := &TLSConfig{CAFile: p.file("ca.crt"), ServerName: name}
	withCert := &TLSConfig{CAFile: p.file("ca.crt"), ServerName: name, CertFile: p.file("client.crt"),
		KeyFile: p.file("client.key")}
	prom := StartPrometheus(ctx, t, PrometheusOptions{Binary: bin, Jobs: []ScrapeJob{
		{Name: "open", Scheme: "https", TLS: caOnly, Targets: []ScrapeTarget{{Address: open}}},
		{Name: "mtls", Scheme: "https", TLS: withCert, Targets: []ScrapeTarget{{Address: mtls}}},
	}})
	if err := prom.WaitTargetsUp(ctx, 2); err != nil {
		t.Fatal(err)
	}
	v, _, _, err := prom.API().Query(ctx, `test_up`, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if vec, ok := v.(model.Vector); !ok || len(vec) != 2 {
		t.Errorf("test_up: %v, want a series from each server", v)
	}

	// The same CA without the server name: the certificate does not name the IP.
	if err := prom.SetJobs(ctx, []ScrapeJob{{Name: "open", Scheme: "https", TLS: &TLSConfig{CAFile: p.file("ca.crt")},
		Targets: []ScrapeTarget{{Address: open}}}}); err != nil {
		t.Fatal(err)
	}
	var lastErr string
	testenv.PollEvery(60*time.Second, 200*time.Millisecond, func() bool {
		ts, err := prom.API().Targets(ctx)
		if err == nil && len(ts.Active) == 1 && ts.Active[0].LastError != "" {
			lastErr = ts.Active[0].LastError
		}
		return lastErr != ""
	})
	if !strings.Contains(lastErr, "certificate") {
		t.Errorf("scrape without the server name: last error %q, want a certificate error", lastErr)
	}
}

// TestConfigBearerTokenScrape: a real Prometheus sends the token file's content as a
// bearer token on every scrape (as kube-scheduler's /metrics needs it); a target that
// refuses the scrape's credentials (401) is down with that error.
func TestConfigBearerTokenScrape(t *testing.T) {
	t.Parallel()
	const token = "t0ken-of-the-scraper"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, "# TYPE test_up gauge\ntest_up 1\n")
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	for f, content := range map[string]string{good: token + "\n", bad: "someone-else"} {
		if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr := strings.TrimPrefix(srv.URL, "http://")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	prom := StartPrometheus(ctx, t, PrometheusOptions{Jobs: []ScrapeJob{
		{Name: "good", BearerTokenFile: good, Targets: []ScrapeTarget{{Address: addr}}},
		{Name: "bad", BearerTokenFile: bad, Targets: []ScrapeTarget{{Address: addr}}},
	}})
	health := map[string]string{}
	testenv.PollEvery(60*time.Second, 200*time.Millisecond, func() bool {
		if ts, err := prom.API().Targets(ctx); err == nil {
			for _, tg := range ts.Active {
				if tg.Health == "up" || tg.LastError != "" {
					health[tg.ScrapePool] = string(tg.Health) + " " + tg.LastError
				}
			}
		}
		return health["good"] != "" && health["bad"] != ""
	})
	if !strings.HasPrefix(health["good"], "up") {
		t.Errorf("the job with the right token: %q, want up", health["good"])
	}
	if !strings.Contains(health["bad"], "401") {
		t.Errorf("the job with another token: %q, want down with 401", health["bad"])
	}
}

// TestConfigSetJobs: SetJobs moves a job to a new target (as the real-node test
// follows a replaced pod) and keeps the old configuration when it is invalid.
func TestConfigSetJobs(t *testing.T) {
	t.Parallel()
	serve := func(v string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "# TYPE test_up gauge\ntest_up{server=%q} 1\n", v)
		}))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	a, b := serve("a"), serve("b")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	job := func(addr string) []ScrapeJob {
		return []ScrapeJob{{Name: "agent", Targets: []ScrapeTarget{{Address: addr, Labels: map[string]string{"node": "n1"}}}}}
	}
	prom := StartPrometheus(ctx, t, PrometheusOptions{Jobs: job(a)})
	if err := prom.WaitTargetsUp(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := prom.SetJobs(ctx, job(b)); err != nil {
		t.Fatal(err)
	}
	// Only b, up: the discovery manager passes the change on within 5 s.
	var active []string
	for ctx.Err() == nil {
		active = active[:0]
		ts, err := prom.API().Targets(ctx)
		if err == nil {
			for _, tg := range ts.Active {
				active = append(active, fmt.Sprintf("%s %s", tg.ScrapeURL, tg.Health))
			}
		}
		if len(active) == 1 && active[0] == "http://"+b+"/metrics up" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if ctx.Err() != nil {
		t.Fatalf("active targets %v, want only http://%s/metrics up", active, b)
	}
	cfgPath := filepath.Join(filepath.Dir(prom.log), "prometheus.yml")
	before, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := prom.SetJobs(ctx, []ScrapeJob{{Name: "agent", Targets: []ScrapeTarget{{Address: "nope"}}}}); !errors.Is(err,
		ErrScrapeConfig) {
		t.Errorf("SetJobs with a bad address: %v, want ErrScrapeConfig", err)
	}
	// A configuration Prometheus itself refuses (its CA file is missing): the error
	// says so, and the file is put back, so that a later reload does not fail.
	err = prom.SetJobs(ctx, []ScrapeJob{{Name: "agent", Scheme: "https",
		TLS: &TLSConfig{CAFile: filepath.Join(t.TempDir(), "missing-ca.crt")}, Targets: []ScrapeTarget{{Address: b}}}})
	if !errors.Is(err, ErrReload) {
		t.Errorf("SetJobs with a missing CA file: %v, want ErrReload", err)
	}
	if after, err := os.ReadFile(cfgPath); err != nil || string(after) != string(before) {
		t.Errorf("after the refused reload %s holds (%v):\n%s\nwant the previous configuration:\n%s", cfgPath, err,
			after, before)
	}
	if err := prom.reload(ctx); err != nil {
		t.Errorf("reload of the previous file: %v", err)
	}
	prom.Stop()
	prom.Stop() // idempotent; the cleanup calls it again
}

// TestWaitScrapedAfter: once WaitScrapedAfter(since) returns, a query at now sees the
// value every target served after since, not an older one.
func TestWaitScrapedAfter(t *testing.T) {
	t.Parallel()
	var value atomic.Int64
	value.Store(1)
	serve := func() string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "# TYPE test_value gauge\ntest_value %d\n", value.Load())
		}))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	prom := StartPrometheus(ctx, t, PrometheusOptions{Jobs: []ScrapeJob{{Name: "agent",
		Targets: []ScrapeTarget{{Address: serve()}, {Address: serve()}}}}})
	if err := prom.WaitTargetsUp(ctx, 2); err != nil {
		t.Fatal(err)
	}
	value.Store(2)
	if err := prom.WaitScrapedAfter(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	v, _, _, err := prom.API().Query(ctx, "test_value", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	vec, ok := v.(model.Vector)
	if !ok || len(vec) != 2 {
		t.Fatalf("test_value = %v, want two samples", v)
	}
	for _, s := range vec {
		if s.Value != 2 {
			t.Errorf("%v = %v right after WaitScrapedAfter, want 2 (the value served after since)", s.Metric, s.Value)
		}
	}
}
