package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/understory/understory/internal/certreload"
	"github.com/understory/understory/metrics"
)

// errNoClientCert answers a caller without a verified client certificate.
var errNoClientCert = errors.New("a client certificate signed by the extender's -tls-client-ca-file is required")

// openPaths are served to callers without a client certificate even when
// -tls-client-ca-file is set: kubelet's probes (which never present one) and
// Prometheus. /status is not among them: it names every tenant's pods.
var openPaths = map[string]bool{"/healthz": true, "/readyz": true, "/syncz": true, "/metrics": true}

// serverTLS returns the TLS configuration of the HTTPS listener, or nil when
// o asks for plain HTTP. The serving pair is re-read when either file changes
// (cert-manager and kubelet swap Secret volumes in place); so is the client CA.
// A reload that fails keeps the last good files and is logged.
func serverTLS(o options, log *slog.Logger, reg prometheus.Registerer) (*tls.Config, error) {
	if o.certFile == "" {
		return nil, nil
	}
	certs, err := certreload.New(o.certFile, o.keyFile)
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	certs.OnReloadError = func(err error) {
		log.Warn("TLS certificate reload failed; serving the previous one", "err", err)
	}
	if err := metrics.RegisterCertExpiry(reg, "extender", certs.NotAfter); err != nil {
		return nil, err
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate}
	if o.clientCAFile == "" {
		return base, nil
	}
	cas, err := newCAPool(o.clientCAFile)
	if err != nil {
		return nil, fmt.Errorf("client CA: %w", err)
	}
	// VerifyClientCertIfGiven, not RequireAndVerify: probes and Prometheus
	// connect without one; requireClientCert refuses them per path. A
	// certificate that is given but does not verify fails the handshake.
	base.ClientAuth = tls.VerifyClientCertIfGiven
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, err := cas.get()
		if err != nil {
			log.Warn("client CA reload failed; verifying with the previous one", "err", err)
		}
		c := base.Clone()
		c.GetConfigForClient = nil
		c.ClientCAs = pool
		return c, nil
	}
	return base, nil
}

// requireClientCert refuses every request outside openPaths that did not
// come with a client certificate the TLS layer verified.
func requireClientCert(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if openPaths[r.URL.Path] && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			h.ServeHTTP(w, r)
			return
		}
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			http.Error(w, errNoClientCert.Error(), http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// caPool is a CA bundle re-read when the file's modification time or size
// changes, checked on each handshake (one stat).
type caPool struct {
	path string

	mu   sync.Mutex
	pool *x509.CertPool
	mod  time.Time
	size int64
}

func newCAPool(path string) (*caPool, error) {
	p := &caPool{path: path}
	if _, err := p.get(); err != nil {
		return nil, err
	}
	return p, nil
}

// get returns the current pool, reloading it first when the file changed. On
// error it returns the last good pool with the error.
func (p *caPool) get() (*x509.CertPool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fi, err := os.Stat(p.path)
	if err != nil {
		return p.pool, fmt.Errorf("stat %s: %w", p.path, err)
	}
	if p.pool != nil && fi.ModTime().Equal(p.mod) && fi.Size() == p.size {
		return p.pool, nil
	}
	data, err := os.ReadFile(p.path)
	if err != nil {
		return p.pool, fmt.Errorf("reading %s: %w", p.path, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return p.pool, fmt.Errorf("%s holds no PEM certificate: %w", p.path, errBadFlag)
	}
	p.pool, p.mod, p.size = pool, fi.ModTime(), fi.Size()
	return pool, nil
}
