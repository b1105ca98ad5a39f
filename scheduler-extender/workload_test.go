package extender

import (
	"fmt"
	"testing"

	"github.com/understory/understory/scheduler-extender/internal/podtest"
	"github.com/understory/understory/scheduler-extender/placement"
)

// TestPolicyCoverage: the extender builds understory's workload at 99.5 %, so a
// class of 1 % of the pods that FGD's 95 % drops counts; fgd keeps the paper's
// 95 %, and -workload-coverage sets both.
func TestPolicyCoverage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		policy   string
		coverage float64 // Config.WorkloadCoverage; 0: the policy's default
		want     int     // classes the policy sees
	}{
		{"understory default", placement.PolicyUnderstory, 0, 2},
		{"understory explicit 0.9", placement.PolicyUnderstory, 0.9, 1},
		{"fgd default", placement.PolicyFGD, 0, 1},
		{"fgd explicit 1", placement.PolicyFGD, 1, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			cfg.Policy, cfg.WorkloadCoverage = tc.policy, tc.coverage
			srv := testServer(t, newFakeClock(), Deps{}, func(c *Config) { *c = cfg })
			s := srv.state
			for i := range 99 {
				s.UpsertPod(podtest.Pod("ns", fmt.Sprintf("whole%d", i), podtest.GPUs(1)))
			}
			s.UpsertPod(podtest.Pod("ns", "rare", podtest.Milli(160)))
			if err := s.RefreshWorkload(); err != nil {
				t.Fatal(err)
			}
			got := srv.Status().WorkloadClasses
			if got != tc.want {
				t.Fatalf("%s sees %d classes, want %d", tc.policy, got, tc.want)
			}
		})
	}
}
