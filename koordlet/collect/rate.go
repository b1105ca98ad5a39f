package collect

import "time"

// Rate turns samples of a cumulative CPU-time counter into a usage in cores
// (CPU seconds per wall second). The zero value is ready to use; a Rate is
// not safe for concurrent use.
type Rate struct {
	at    time.Time
	value time.Duration
	valid bool
}

// Update records a sample and returns the usage since the previous one.
// ok is false, and the sample becomes the new baseline, on the first
// sample, when the counter went backwards (cgroup recreated, counter reset)
// or when time went backwards. A sample taken at the same instant as the
// baseline is ignored (ok=false, baseline kept). Counter differences are
// computed with wrapping arithmetic, so a counter wrapping past the int64
// range still yields the right delta.
func (r *Rate) Update(now time.Time, cumulative time.Duration) (cores float64, ok bool) {
	if !r.valid {
		r.at, r.value, r.valid = now, cumulative, true
		return 0, false
	}
	dt := now.Sub(r.at)
	if dt == 0 {
		return 0, false
	}
	delta := cumulative - r.value
	r.at, r.value = now, cumulative
	if dt < 0 || delta < 0 {
		return 0, false
	}
	return float64(delta) / float64(dt), true
}

// Reset forgets the baseline; the next Update returns ok=false.
func (r *Rate) Reset() { *r = Rate{} }
