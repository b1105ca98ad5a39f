package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// testCA is a throwaway CA issuing serving and client certificates.
type testCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
}

func newTestCA(t *testing.T, cn string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a PEM pair for cn: a serving certificate for 127.0.0.1 when
// server, else a client certificate.
func (ca *testCA) issue(t *testing.T, cn string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	// Write then rename, as kubelet swaps a Secret volume: a reader never
	// sees half a file. The mtime moves forward so the reloaders notice.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestTLSFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string // error part; "" for success
	}{
		{"plain", nil, ""},
		{"https", []string{"-tls-cert-file", "c", "-tls-private-key-file", "k"}, ""},
		{"mtls", []string{"-tls-cert-file", "c", "-tls-private-key-file", "k", "-tls-client-ca-file", "ca"}, ""},
		{"cert without key", []string{"-tls-cert-file", "c"}, "go together"},
		{"key without cert", []string{"-tls-private-key-file", "k"}, "go together"},
		{"client CA without TLS", []string{"-tls-client-ca-file", "ca"}, "needs -tls-cert-file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseFlags(tc.args, io.Discard)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errBadFlag) {
				t.Fatalf("err %v, want %q wrapping errBadFlag", err, tc.want)
			}
		})
	}
}

// tlsFixture serves a stub handler through newHTTPServer with the files in dir.
type tlsFixture struct {
	dir, url                  string
	certFile, keyFile, caFile string
	ca                        *testCA
}

func startTLS(t *testing.T, clientCA bool) *tlsFixture {
	t.Helper()
	f := &tlsFixture{dir: t.TempDir(), ca: newTestCA(t, "extender-ca")}
	f.certFile, f.keyFile, f.caFile = filepath.Join(f.dir, "tls.crt"), filepath.Join(f.dir, "tls.key"),
		filepath.Join(f.dir, "ca.crt")
	cert, key := f.ca.issue(t, "extender", true)
	writeFile(t, f.certFile, cert)
	writeFile(t, f.keyFile, key)
	writeFile(t, f.caFile, f.ca.certPEM)
	args := []string{"-tls-cert-file", f.certFile, "-tls-private-key-file", f.keyFile}
	if clientCA {
		args = append(args, "-tls-client-ca-file", f.caFile)
	}
	o, err := parseFlags(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := prometheus.NewRegistry()
	cfg, err := serverTLS(o, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	// The serving certificate's expiry is exported (the expiry alert reads it).
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "understory_tls_certificate_expiry_timestamp_seconds" ||
		mfs[0].GetMetric()[0].GetGauge().GetValue() < float64(time.Now().Unix()) {
		t.Fatalf("metrics %v, want the serving certificate's expiry, in the future", mfs)
	}
	stub := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok "+r.URL.Path) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := newHTTPServer(o, stub, cfg, log)
	done := make(chan error, 1)
	go func() { done <- serve(hs, ln) }()
	t.Cleanup(func() {
		hs.Close()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	f.url = "https://" + ln.Addr().String()
	return f
}

// client trusts roots and presents cert (if any).
func client(roots []byte, cert *tls.Certificate) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(roots)
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		// Always present it: Go's client would otherwise send a certificate
		// only when its issuer is among the CAs the server names.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
}

func do(c *http.Client, method, url string) (int, string, error) {
	req, err := http.NewRequest(method, url, strings.NewReader("{}"))
	if err != nil {
		return 0, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func TestServeTLSClientCertificates(t *testing.T) {
	t.Parallel()
	f := startTLS(t, true)
	cc, ck := f.ca.issue(t, "kube-scheduler", false)
	good, err := tls.X509KeyPair(cc, ck)
	if err != nil {
		t.Fatal(err)
	}
	other := newTestCA(t, "someone-else")
	oc, ok := other.issue(t, "intruder", false)
	bad, err := tls.X509KeyPair(oc, ok)
	if err != nil {
		t.Fatal(err)
	}
	anon, scheduler, intruder := client(f.ca.certPEM, nil), client(f.ca.certPEM, &good), client(f.ca.certPEM, &bad)
	tests := []struct {
		name   string
		c      *http.Client
		method string
		path   string
		code   int // 0: the handshake fails
	}{
		{"probe without certificate", anon, http.MethodGet, "/healthz", http.StatusOK},
		{"readiness without certificate", anon, http.MethodGet, "/readyz", http.StatusOK},
		{"metrics without certificate", anon, http.MethodGet, "/metrics", http.StatusOK},
		{"status needs a certificate", anon, http.MethodGet, "/status", http.StatusForbidden},
		{"bind needs a certificate", anon, http.MethodPost, "/bind", http.StatusForbidden},
		{"filter needs a certificate", anon, http.MethodPost, "/filter", http.StatusForbidden},
		{"POST to an open path needs one too", anon, http.MethodPost, "/healthz", http.StatusForbidden},
		{"scheduler binds", scheduler, http.MethodPost, "/bind", http.StatusOK},
		{"scheduler reads status", scheduler, http.MethodGet, "/status", http.StatusOK},
		{"certificate of another CA", intruder, http.MethodPost, "/bind", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, body, err := do(tc.c, tc.method, f.url+tc.path)
			if tc.code == 0 {
				if err == nil {
					t.Fatalf("handshake succeeded: %d %s", code, body)
				}
				return
			}
			if err != nil || code != tc.code {
				t.Fatalf("%s %s: %d %q %v, want %d", tc.method, tc.path, code, body, err, tc.code)
			}
			if code == http.StatusForbidden && !strings.Contains(body, "client certificate") {
				t.Errorf("refusal does not say why: %q", body)
			}
		})
	}
}

func TestServeTLSWithoutClientCA(t *testing.T) {
	t.Parallel()
	f := startTLS(t, false)
	code, body, err := do(client(f.ca.certPEM, nil), http.MethodPost, f.url+"/bind")
	if err != nil || code != http.StatusOK {
		t.Fatalf("POST /bind: %d %q %v", code, body, err)
	}
}

// TestTLSReload replaces the serving pair and the client CA in place (as
// cert-manager renews a Secret) and checks both are picked up without a
// restart, and that a broken file keeps the last good one.
func TestTLSReload(t *testing.T) {
	t.Parallel()
	f := startTLS(t, true)
	ca2 := newTestCA(t, "extender-ca-2")
	cc2, ck2 := ca2.issue(t, "kube-scheduler", false)
	cert2, err := tls.X509KeyPair(cc2, ck2)
	if err != nil {
		t.Fatal(err)
	}
	newClient := client(ca2.certPEM, &cert2)
	if _, _, err := do(newClient, http.MethodPost, f.url+"/bind"); err == nil {
		t.Fatal("a client of the next CA was accepted before the rotation")
	}
	// Rotate: new CA, serving pair from it, CA bundle holding it. The mtime
	// check has a filesystem granularity: make sure it moves.
	time.Sleep(20 * time.Millisecond)
	sc, sk := ca2.issue(t, "extender", true)
	writeFile(t, f.keyFile, sk)
	writeFile(t, f.certFile, sc)
	writeFile(t, f.caFile, ca2.certPEM)
	code, body, err := do(newClient, http.MethodPost, f.url+"/bind")
	if err != nil || code != http.StatusOK {
		t.Fatalf("after rotation: %d %q %v", code, body, err)
	}
	// A broken CA file keeps serving with the last good one.
	time.Sleep(20 * time.Millisecond)
	writeFile(t, f.caFile, []byte("not a certificate"))
	code, body, err = do(newClient, http.MethodPost, f.url+"/bind")
	if err != nil || code != http.StatusOK {
		t.Fatalf("after a broken CA file: %d %q %v", code, body, err)
	}
}

func TestServerTLSErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newTestCA(t, "ca")
	cert, key := ca.issue(t, "x", true)
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeFile(t, certFile, cert)
	writeFile(t, keyFile, key)
	garbage := filepath.Join(dir, "garbage")
	writeFile(t, garbage, []byte("garbage"))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"missing cert", []string{"-tls-cert-file", filepath.Join(dir, "none"), "-tls-private-key-file", keyFile}, "serving certificate"},
		{"key is not PEM", []string{"-tls-cert-file", certFile, "-tls-private-key-file", garbage}, "serving certificate"},
		{"client CA missing", []string{"-tls-cert-file", certFile, "-tls-private-key-file", keyFile,
			"-tls-client-ca-file", filepath.Join(dir, "none")}, "client CA"},
		{"client CA not PEM", []string{"-tls-cert-file", certFile, "-tls-private-key-file", keyFile,
			"-tls-client-ca-file", garbage}, "no PEM certificate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o, err := parseFlags(tc.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := serverTLS(o, log, prometheus.NewRegistry()); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}
