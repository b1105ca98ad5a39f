package certreload

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func writePair(t *testing.T, dir, cn string) (string, string) {
	t.Helper()
	return writePairUntil(t, dir, cn, time.Now().Add(time.Hour))
}

func writePairUntil(t *testing.T, dir, cn string, notAfter time.Time) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(key)
	cf, kf := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	// Write to temp names and rename, as a Secret volume update swaps files.
	for _, f := range []struct {
		path string
		data []byte
	}{{cf, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, {kf, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})}} {
		if err := os.WriteFile(f.path+".tmp", f.data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(f.path+".tmp", f.path); err != nil {
			t.Fatal(err)
		}
	}
	return cf, kf
}

func TestReloader(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cf, kf := writePair(t, dir, "first")
	r, err := New(cf, kf)
	if err != nil {
		t.Fatal(err)
	}
	cn := func() string {
		c, err := r.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		x, _ := x509.ParseCertificate(c.Certificate[0])
		return x.Subject.CommonName
	}
	if got := cn(); got != "first" {
		t.Fatalf("CN %q", got)
	}
	writePair(t, dir, "second")
	later := time.Now().Add(time.Minute) // mtime granularity: make the change visible
	os.Chtimes(cf, later, later)
	if got := cn(); got != "second" {
		t.Fatalf("after rotation CN %q, want second", got)
	}
	// A broken pair keeps the last good certificate and reports the error.
	var reported error
	r.OnReloadError = func(err error) { reported = err }
	os.WriteFile(kf, []byte("garbage"), 0o600)
	if got := cn(); got != "second" || reported == nil {
		t.Fatalf("after a broken write: CN %q, reported %v", got, reported)
	}
	if _, err := New(filepath.Join(dir, "missing"), kf); err == nil {
		t.Fatal("missing files accepted")
	}
}

// NotAfter follows the certificate on disk: a rotated pair's expiry shows without a
// handshake (Prometheus scrapes it), and a broken write keeps the last good one's.
func TestReloaderNotAfter(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first := time.Now().Add(20 * 24 * time.Hour).Truncate(time.Second)
	cf, kf := writePairUntil(t, dir, "first", first)
	r, err := New(cf, kf)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.NotAfter(); !got.Equal(first) {
		t.Fatalf("NotAfter %v, want %v", got, first)
	}
	second := time.Now().Add(365 * 24 * time.Hour).Truncate(time.Second)
	writePairUntil(t, dir, "second", second)
	later := time.Now().Add(time.Minute)
	os.Chtimes(cf, later, later)
	if got := r.NotAfter(); !got.Equal(second) {
		t.Fatalf("after rotation NotAfter %v, want %v", got, second)
	}
	os.WriteFile(kf, []byte("garbage"), 0o600)
	if got := r.NotAfter(); !got.Equal(second) {
		t.Fatalf("after a broken write NotAfter %v, want the last good %v", got, second)
	}
}
