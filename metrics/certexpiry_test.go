package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestCertExpiry(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		at   time.Time
		want string
	}{{time.Unix(1798761600, 0), "1.7987616e+09"}, {time.Time{}, "0"}} {
		reg := prometheus.NewPedanticRegistry()
		if err := RegisterCertExpiry(reg, "webhook", func() time.Time { return tc.at }); err != nil {
			t.Fatal(err)
		}
		want := `# HELP understory_tls_certificate_expiry_timestamp_seconds When the TLS certificate served now expires (Unix seconds); 0 when none is loaded.
# TYPE understory_tls_certificate_expiry_timestamp_seconds gauge
understory_tls_certificate_expiry_timestamp_seconds{certificate="webhook"} ` + tc.want + "\n"
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
			t.Error(err)
		}
	}
}
