package qos

import (
	"math"
	"slices"
	"time"
)

// maxWindowSteps bounds the number of steps a percentileWindow keeps: the
// percentile is recomputed (one sort) each time a step closes, so the cost
// stays a few microseconds whatever the configured window.
const maxWindowSteps = 300

// percentileWindow is a sliding window of coarse steps, each holding the
// maximum of the samples added during it, and the nearest-rank percentile of
// the steps that are complete. It is the "LS usage over lsWindow" of the
// Reclaimer. All memory is allocated by newPercentileWindow; add does not
// allocate.
//
// Steps are numbered from the time of the first sample after a reset; a
// sample whose time falls in a later step closes the current one. Steps that
// saw no sample (a gap) simply hold nothing: the percentile is over the steps
// that were observed within the window, never over invented values.
type percentileWindow struct {
	p     float64       // percentile in (0, 1]
	width time.Duration // length of one step
	steps int64         // steps in the window

	origin  time.Time // time of step 0
	started bool
	cur     int64   // index of the open step
	curMax  float64 // maximum of the open step

	idx  []int64   // ring: step index held in slot i (-1: empty)
	val  []float64 // ring: maximum of that step
	tmp  []float64 // scratch for the sort
	pct  float64   // percentile of the complete steps in the window
	have int       // complete steps behind pct
}

// newPercentileWindow returns a window of length window for percentile p. The
// step is 1 s, or window/maxWindowSteps when that is longer, so a window holds
// at most maxWindowSteps steps.
func newPercentileWindow(p float64, window time.Duration) *percentileWindow {
	width := time.Second
	if w := (window + maxWindowSteps - 1) / maxWindowSteps; w > width {
		width = w
	}
	steps := int64((window + width - 1) / width)
	if steps < 1 {
		steps = 1
	}
	w := &percentileWindow{
		p: p, width: width, steps: steps,
		idx: make([]int64, steps), val: make([]float64, steps), tmp: make([]float64, 0, steps),
	}
	w.reset()
	return w
}

// reset forgets every sample.
func (w *percentileWindow) reset() {
	w.started = false
	w.have, w.pct = 0, 0
	for i := range w.idx {
		w.idx[i] = -1
	}
}

// add records sample v taken at now. now must not be before the previous
// sample's time (the Reclaimer resets the window when the clock goes back).
func (w *percentileWindow) add(now time.Time, v float64) {
	if !w.started {
		w.origin, w.started = now, true
		w.cur, w.curMax = 0, v
		return
	}
	step := int64(now.Sub(w.origin) / w.width)
	if step <= w.cur {
		w.curMax = math.Max(w.curMax, v)
		return
	}
	// Close the open step and recompute the percentile once per step.
	slot := w.cur % w.steps
	w.idx[slot], w.val[slot] = w.cur, w.curMax
	w.cur, w.curMax = step, v
	w.recompute()
}

// recompute sets pct from the complete steps within the window that ends at
// the open step.
func (w *percentileWindow) recompute() {
	w.tmp = w.tmp[:0]
	// The window is the last `steps` complete steps. Step cur-steps shares
	// its slot with the open step, which is written only when it closes.
	oldest := w.cur - w.steps
	for i, s := range w.idx {
		if s >= oldest && s < w.cur {
			w.tmp = append(w.tmp, w.val[i])
		}
	}
	w.have = len(w.tmp)
	if w.have == 0 {
		w.pct = 0
		return
	}
	slices.Sort(w.tmp)
	w.pct = w.tmp[nearestRank(w.p, w.have)]
}

// nearestRank is the index, in n sorted values, of the p-th percentile by the
// nearest-rank method: the smallest value with at least p*n values at or below
// it.
func nearestRank(p float64, n int) int {
	// The epsilon keeps 0.95*300 (284.99999999999997 in float64) at rank 285.
	i := int(math.Ceil(p*float64(n)-1e-9)) - 1
	return min(max(i, 0), n-1)
}

// percentile returns the percentile of the complete steps in the window, and
// how many steps that is (0: none yet; the value is then 0).
func (w *percentileWindow) percentile() (float64, int) { return w.pct, w.have }
