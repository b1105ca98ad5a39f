package controlplane

import (
	"fmt"
	"net"
)

// WebhookCerts is a throwaway CA and a serving certificate signed by it, for an
// admission webhook that kube-apiserver calls over TLS.
type WebhookCerts struct {
	// CAPEM goes into the webhook configuration's clientConfig.caBundle.
	CAPEM []byte
	// CertPEM and KeyPEM are the webhook's serving pair.
	CertPEM, KeyPEM []byte
}

// NewWebhookCerts issues a serving certificate for 127.0.0.1 and localhost (the
// apiserver reaches an in-process webhook over loopback, by URL). Its CA is separate
// from the control plane's.
func NewWebhookCerts() (*WebhookCerts, error) {
	ca, err := newPKI()
	if err != nil {
		return nil, fmt.Errorf("webhook CA: %w", err)
	}
	cert, key, err := ca.issue(certRequest{
		commonName: "understory-e2e-webhook",
		dnsNames:   []string{"localhost"},
		ips:        []net.IP{net.IPv4(127, 0, 0, 1)},
		server:     true,
	})
	if err != nil {
		return nil, err
	}
	return &WebhookCerts{CAPEM: ca.certPEM, CertPEM: cert, KeyPEM: key}, nil
}
