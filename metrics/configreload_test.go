package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestConfigReloadMetricsGolden(t *testing.T) {
	t.Parallel()
	const header = `
# HELP understory_koordlet_config_info 1 for the sha256 of the configuration file in force.
# TYPE understory_koordlet_config_info gauge
`
	const counters = `
# HELP understory_koordlet_config_last_reload_success 1 when the last change of the configuration file was applied (or none since the start), 0 when it was rejected.
# TYPE understory_koordlet_config_last_reload_success gauge
understory_koordlet_config_last_reload_success %s
# HELP understory_koordlet_config_reloads_total Changes of the agent's configuration file, by result: applied, or rejected (the configuration in force stays).
# TYPE understory_koordlet_config_reloads_total counter
understory_koordlet_config_reloads_total{result="applied"} %s
understory_koordlet_config_reloads_total{result="rejected"} %s
# HELP understory_koordlet_config_restart_pending_fields Changed configuration fields that take effect only when the agent restarts.
# TYPE understory_koordlet_config_restart_pending_fields gauge
understory_koordlet_config_restart_pending_fields %s
`
	for _, tc := range []struct {
		name string
		do   func(m *ConfigReload)
		want string
	}{
		{"start", func(m *ConfigReload) { m.SetInForce("aaa") },
			header + `understory_koordlet_config_info{hash="aaa"} 1` + fill(counters, "1", "0", "0", "0")},
		{"applied replaces the hash", func(m *ConfigReload) {
			m.SetInForce("aaa")
			m.Reloads.WithLabelValues(ReloadApplied).Inc()
			m.RestartPending.Set(2)
			m.SetInForce("bbb")
		}, header + `understory_koordlet_config_info{hash="bbb"} 1` + fill(counters, "1", "1", "0", "2")},
		{"rejected keeps the hash", func(m *ConfigReload) {
			m.SetInForce("aaa")
			m.Reloads.WithLabelValues(ReloadRejected).Inc()
			m.LastSuccess.Set(0)
		}, header + `understory_koordlet_config_info{hash="aaa"} 1` + fill(counters, "0", "0", "1", "0")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			m, err := NewConfigReload(reg)
			if err != nil {
				t.Fatal(err)
			}
			tc.do(m)
			if err := testutil.GatherAndCompare(reg, strings.NewReader(tc.want)); err != nil {
				t.Error(err)
			}
		})
	}
}

// fill replaces each %s of format by the next value.
func fill(format string, values ...string) string {
	for _, v := range values {
		format = strings.Replace(format, "%s", v, 1)
	}
	return format
}
