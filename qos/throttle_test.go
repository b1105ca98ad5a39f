package qos_test

import (
	"testing"

	"github.com/understory/understory/qos"
)

func TestHardThrottled(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name               string
		periods, throttled uint64
		share              float64
		hard               bool
	}{
		{"no periods", 0, 0, 0, false},
		{"never throttled", 10, 0, 0, false},
		{"below half", 10, 4, 0.4, false},
		{"half", 10, 5, 0.5, true},
		{"always", 10, 10, 1, true},
		{"too few periods to tell", 4, 4, 1, false},
		{"the fewest periods", qos.MinThrottlePeriods, qos.MinThrottlePeriods, 1, true},
		{"inconsistent counters", 3, 7, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			share, hard := qos.HardThrottled(tc.periods, tc.throttled)
			if share != tc.share || hard != tc.hard {
				t.Fatalf("HardThrottled(%d, %d) = %v, %v; want %v, %v", tc.periods, tc.throttled, share, hard, tc.share, tc.hard)
			}
		})
	}
}
