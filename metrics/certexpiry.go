package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// RegisterCertExpiry publishes understory_tls_certificate_expiry_timestamp_seconds
// {certificate=name} on reg: when the certificate a server serves now expires, read
// at every scrape through notAfter (which picks up a rotated Secret). A zero time
// (nothing loaded) publishes 0, which the expiry alert reads as expired.
func RegisterCertExpiry(reg prometheus.Registerer, name string, notAfter func() time.Time) error {
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "understory", Subsystem: "tls", Name: "certificate_expiry_timestamp_seconds",
		Help:        "When the TLS certificate served now expires (Unix seconds); 0 when none is loaded.",
		ConstLabels: prometheus.Labels{"certificate": name},
	}, func() float64 {
		t := notAfter()
		if t.IsZero() {
			return 0
		}
		return float64(t.Unix())
	}))
}
