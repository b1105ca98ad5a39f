package certreload

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// Reloader serves a TLS certificate from a certificate and a key file and
// reloads them when either file's modification time or size changes (cert-manager
// and kubelet replace Secret volumes by swapping a symlink, which changes both). It
// is checked on every handshake: two stat calls. A reload that fails (a half-written
// pair, a key that does not match) keeps serving the last good certificate and is
// retried on the next handshake.
type Reloader struct {
	certFile, keyFile string
	// OnReloadError, if set, is called for every failed reload (for logs and metrics).
	OnReloadError func(error)

	mu      sync.Mutex
	cert    *tls.Certificate
	certSig fileSig
	keySig  fileSig
}

type fileSig struct {
	mod  time.Time
	size int64
}

// New loads the pair once; an error there is fatal for the caller.
func New(certFile, keyFile string) (*Reloader, error) {
	r := &Reloader{certFile: certFile, keyFile: keyFile}
	if _, err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

func sig(path string) (fileSig, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileSig{}, fmt.Errorf("stat %s: %w", path, err)
	}
	return fileSig{fi.ModTime(), fi.Size()}, nil
}

// load reloads the pair if the files changed and returns the current certificate.
func (r *Reloader) load() (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cs, err1 := sig(r.certFile)
	ks, err2 := sig(r.keyFile)
	if err := errors.Join(err1, err2); err != nil {
		return r.cert, err
	}
	if r.cert != nil && cs == r.certSig && ks == r.keySig {
		return r.cert, nil
	}
	c, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return r.cert, fmt.Errorf("loading TLS key pair: %w", err)
	}
	r.cert, r.certSig, r.keySig = &c, cs, ks
	return r.cert, nil
}

// NotAfter is when the certificate served now (re-read if its files changed)
// expires; zero when none could be loaded.
func (r *Reloader) NotAfter() time.Time {
	c, _ := r.load()
	if c == nil || len(c.Certificate) == 0 {
		return time.Time{}
	}
	leaf := c.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return time.Time{}
		}
	}
	return leaf.NotAfter
}

// GetCertificate is tls.Config.GetCertificate.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c, err := r.load()
	if err != nil && r.OnReloadError != nil {
		r.OnReloadError(err)
	}
	if c == nil {
		return nil, err
	}
	return c, nil
}
