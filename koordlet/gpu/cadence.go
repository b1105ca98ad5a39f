package gpu

import "time"

// DefaultFullScrapePeriod is how often the GPU loop reads a GPU in full when nothing on
// it needs a fast reaction (see scrapeFor and loopFast).
const DefaultFullScrapePeriod = time.Second

// Cadences of GPUStatus.Cadence.
const (
	// CadenceFast: the GPU is read in full every loop period: batch pods share it with
	// other processes (or it failed its last read).
	CadenceFast = "fast"
	// CadenceProbe: the GPU's process list is probed every loop period; it is read in
	// full when the list changes, and every full-scrape period.
	CadenceProbe = "probe"
	// CadenceSlow: no GPU of the node runs a batch process, so the loop runs every
	// full-scrape period and reads every GPU in full then.
	CadenceSlow = "slow"
)

// gpuCadence is what the loop knew of one GPU after a step, to plan the next scrape.
type gpuCadence struct {
	// known: the GPU was in the last step's scrape.
	known   bool
	healthy bool
	// batch: batch pods have processes on the GPU; shared: other processes (LS, BE, not
	// attributed to a pod) too.
	batch, shared bool
	// scrapedAt is the GPU's last full scrape.
	scrapedAt time.Time
}

// scrapeFor decides how much of one GPU the next step reads, at now, with the loop's
// period and full-scrape period fullEvery.
//
// Reaction matters only where batch runs next to something else: there a rise of the
// LS utilisation must cut batch within a loop period, and only a full read (the
// per-process utilisation) shows it. So a GPU that batch pods share with other
// processes is read in full every period, as is one whose last read failed or that
// is new. Every other GPU is only probed (its compute-process list, one NVML call,
// no /proc read): an LS process arriving on a batch GPU, or batch arriving on an LS
// GPU, changes the list, and the collector then reads that GPU in full within the same
// step, so the cut is as fast as with full reads. A GPU without batch needs no fast
// reaction at all; its figures (metrics, node-metrics, /status) are refreshed every
// fullEvery. A fullEvery of one loop period reads every GPU in full every period.
func scrapeFor(g gpuCadence, now time.Time, period, fullEvery time.Duration) Scrape {
	switch {
	case !g.known, !g.healthy, g.shared, g.scrapedAt.IsZero(), now.Before(g.scrapedAt):
		return ScrapeFull
	// Steps come about one period apart, never exactly: the full read is due from half
	// a period before fullEvery has passed, so that it is not put off by a whole period.
	case now.Sub(g.scrapedAt) >= fullEvery-period/2:
		return ScrapeFull
	}
	return ScrapeProbe
}

// loopFast says whether the loop's next step comes after one loop period (true) or
// after the full-scrape period. ok is false after a failed scrape (nothing is known).
//
// Only a GPU that batch pods use needs the fast loop: there an LS process may arrive at
// any time and must be seen within a period. While no GPU of the node runs a batch
// process there is nothing to cut, and the loop wakes only every full-scrape period:
// batch that starts on a GPU with LS is then seen within that period (a batch job's
// start, CUDA context and data loading, takes seconds anyway), and from then on the
// loop is fast.
func loopFast(ok bool, cads []gpuCadence) bool {
	if !ok {
		return true
	}
	for _, g := range cads {
		if g.known && g.batch {
			return true
		}
	}
	return false
}

// cadenceOf names a GPU's cadence for /status.
func cadenceOf(g gpuCadence, fast bool, period, fullEvery time.Duration) string {
	switch {
	case g.shared || !g.healthy || fullEvery-period/2 <= period:
		return CadenceFast
	case fast:
		return CadenceProbe
	}
	return CadenceSlow
}
