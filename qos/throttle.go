package qos

// Hard throttling: when the agent tells a batch pod's owner (a Warning event) that the
// budget holds the pod back in most of its CFS periods.

const (
	// HardThrottledShare is the share of a group's CFS periods (those with runnable
	// tasks) in which it was throttled, at or above which it counts as throttled hard.
	HardThrottledShare = 0.5
	// MinThrottlePeriods is the fewest CFS periods with runnable tasks an interval must
	// have before its share means anything (a 1 s period gives ten in the agent's 10 s
	// statistics interval).
	MinThrottlePeriods = 5
)

// HardThrottled reports the share of periods (CFS periods with runnable tasks in an
// interval) in which a group was throttled (throttled of them), and whether that makes it
// throttled hard: at least MinThrottlePeriods periods and a share of at least
// HardThrottledShare. Counters that went backwards (a recreated cgroup) count as nothing.
func HardThrottled(periods, throttled uint64) (share float64, hard bool) {
	if periods == 0 || throttled > periods {
		return 0, false
	}
	share = float64(throttled) / float64(periods)
	return share, periods >= MinThrottlePeriods && share >= HardThrottledShare
}
