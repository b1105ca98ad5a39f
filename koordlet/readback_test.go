package koordlet

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/understory/understory/cgroups/cgroupstest"
)

// systemd re-applies a unit's own properties on daemon-reload (and when it realises a
// unit): for the tier's slice and a batch pod's, which nobody gave properties, that is
// cpu.max "max", cpu.weight 100 and cpu.idle 0. The agent writes them again: the tier
// within the next period, the pods within a slow period.
func TestAgentRewritesSettingsResetUnderIt(t *testing.T) {
	t.Parallel()
	for _, kind := range []cgroupstest.Kind{cgroupstest.V2, cgroupstest.V1Separate} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, kind, nil)
			busy := r.warmUp()
			for range slowEvery {
				r.step(1.5, busy)
			}
			if q := r.quota(r.tier); q <= 0 || r.file(r.tier, "cpu.idle") != "1" {
				t.Fatalf("before the reset: tier quota %v, cpu.idle %q: want bounded and idle", q, r.file(r.tier, "cpu.idle"))
			}
			if q := r.quota(r.inPlace); q <= 0 || r.file(r.inPlace, "cpu.idle") != "1" {
				t.Fatalf("before the reset: in-place pod quota %v, cpu.idle %q: want bounded and idle", q, r.file(r.inPlace, "cpu.idle"))
			}
			reset := func(cg string) {
				files := map[string]string{"cpu.idle": "0\n", "cpu.max": "max 100000\n", "cpu.weight": "100\n"}
				if !kind.IsV2() {
					files = map[string]string{"cpu.idle": "0\n", "cpu.cfs_quota_us": "-1\n", "cpu.shares": "1024\n"}
				}
				for f, v := range files {
					if err := os.WriteFile(filepath.Join(cgroupstest.Dir(r.root, kind, cg), f), []byte(v), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			reset(r.tier)
			reset(r.inPlace)
			r.step(1.5, busy)
			if q := r.quota(r.tier); q <= 0 || r.file(r.tier, "cpu.idle") != "1" {
				t.Errorf("one period after the reset: tier quota %v, cpu.idle %q: want bounded and idle again", q, r.file(r.tier, "cpu.idle"))
			}
			for range slowEvery {
				r.step(1.5, busy)
			}
			if q := r.quota(r.inPlace); q <= 0 || r.file(r.inPlace, "cpu.idle") != "1" {
				t.Errorf("a slow period after the reset: in-place pod quota %v, cpu.idle %q: want bounded and idle again", q, r.file(r.inPlace, "cpu.idle"))
			}
			r.checkWithinBudget(r.inPlace)
		})
	}
}
