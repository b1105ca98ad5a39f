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

// systemd thaws a frozen unit on daemon-reload (it re-applies its own freezer state,
// "running"): while LS still leaves batch nothing the agent freezes the tier again. And a
// tier asking to be frozen that the agent did not decide to freeze is thawed.
func TestAgentFollowsTierFreezerRewrittenUnderIt(t *testing.T) {
	t.Parallel()
	for _, kind := range []cgroupstest.Kind{cgroupstest.V2, cgroupstest.V1Separate} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, kind, nil)
			file, frozen, thawed := "cgroup.freeze", "1", "0"
			if !kind.IsV2() {
				file, frozen, thawed = "freezer.state", "FROZEN", "THAWED"
			}
			set := func(v string) {
				t.Helper()
				if err := os.WriteFile(filepath.Join(cgroupstest.Dir(r.root, kind, r.tier), file), []byte(v+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			get := func() string { return r.file(r.tier, file) }
			if !kind.IsV2() {
				get = func() string { return r.freezerState(r.tier) }
				set = func(v string) {
					t.Helper()
					if err := os.WriteFile(filepath.Join(r.root, "freezer", r.tier, file), []byte(v+"\n"), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			crowded := map[string]float64{r.lsCg: 1.95, r.inPlace: 0.02, r.inTier: 0.02}
			r.step(0, nil)
			for range 25 {
				r.step(2, crowded)
			}
			if got := get(); got != frozen {
				t.Fatalf("tier %s %q after 2.5 s of contention, want %s", file, got, frozen)
			}
			set(thawed) // daemon-reload
			r.step(2, crowded)
			r.step(2, crowded)
			if got := get(); got != frozen {
				t.Errorf("tier %s %q two periods after another writer thawed it under contention, want %s again", file, got, frozen)
			}
			calm := map[string]float64{r.lsCg: 0.3, r.inPlace: 0, r.inTier: 0}
			for range 70 {
				r.step(0.4, calm)
			}
			if got := get(); got != thawed {
				t.Fatalf("tier %s %q after LS calmed, want %s", file, got, thawed)
			}
			set(frozen) // a freeze nobody decided
			r.step(0.4, calm)
			r.step(0.4, calm)
			if got := get(); got != thawed {
				t.Errorf("tier %s %q two periods after another writer froze it with LS calm, want %s", file, got, thawed)
			}
		})
	}
}
