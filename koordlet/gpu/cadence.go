package gpu

import "time"

// DefaultFullScrapePeriod is how often the GPU loop reads a GPU in full when nothing on
// it needs a fast reaction (see scrapeFor and loopFast).
const DefaultFullScrapePeriod = time.Second

// Cadences of GPUStatus.Cadence.
const (
	// CadenceFast: the GPU is read in full every loop period: batch pods run beside other
	// processes there (or it failed its last read).
	CadenceFast = "fast"
	// CadenceFrozen: batch pods share the GPU with other processes and the loop holds
	// them frozen: its process list and its own utilisation are read every loop period
	// (ScrapeUtil), in full on a change of the list and every full-scrape period.
	CadenceFrozen = "frozen"
	// CadenceMPS: every LS and batch process on the GPU is a client of the agent's MPS
	// server and batch runs in its partition: probed like CadenceProbe. The partition,
	// not the loop's reaction, protects LS there.
	CadenceMPS = "mps"
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
	// frozen: the step's decision holds the GPU's batch pods frozen with the freeze
	// lever (not an outgrown MPS partition: there the MPS server's share of the
	// per-process figures is taken out of LS, which the device's utilisation cannot).
	frozen bool
	// mps: the step's decision runs the GPU's batch in its MPS partition (the MPS lever,
	// not frozen).
	mps bool
	// scrapedAt is the GPU's last full scrape.
	scrapedAt time.Time
}

// scrapeFor decides how much of one GPU the next step reads, at now, with the loop's
// period and full-scrape period fullEvery.
//
// Reaction matters only where batch runs next to something else: there a rise of the
// LS utilisation must cut batch within a loop period, and only a full read (the
// per-process utilisation) shows it. So a GPU where batch pods run beside other
// processes is read in full every period, as is one whose last read failed or that
// is new. Where the loop holds that batch frozen, nothing of batch computes: the GPU's
// own utilisation is the other processes', and it alone decides when batch is thawed
// (LS idle for `hold`), so the GPU is probed with its utilisation (ScrapeUtil, two
// cheap NVML calls) instead of the driver's per-process utilisation, the dearest
// query of a full read. Every other GPU is only probed (its compute-process list, one
// NVML call, no /proc read): an LS process arriving on a batch GPU, or batch arriving
// on an LS GPU, changes the list, and the collector then reads that GPU in full within
// the same step, so the cut is as fast as with full reads. So is a GPU where LS and
// batch run in their MPS partitions: the partition protects LS without the loop, and
// the per-process utilisation shows little there (on an H200 the driver reported the
// clients' work under the MPS server's PID, not per client); an LS demand outgrowing
// its partition is seen within fullEvery. A GPU without batch needs no fast reaction
// at all; its figures (metrics, node-metrics, /status) are refreshed every fullEvery,
// as are a frozen GPU's per-process figures. A fullEvery of one loop period reads
// every GPU in full every period.
func scrapeFor(g gpuCadence, now time.Time, period, fullEvery time.Duration) Scrape {
	switch {
	case !g.known, !g.healthy, g.scrapedAt.IsZero(), now.Before(g.scrapedAt):
		return ScrapeFull
	// Steps come about one period apart, never exactly: the full read is due from half
	// a period before fullEvery has passed, so that it is not put off by a whole period.
	case now.Sub(g.scrapedAt) >= fullEvery-period/2:
		return ScrapeFull
	case g.shared && g.frozen:
		return ScrapeUtil
	case g.shared && !g.mps:
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
	case !g.healthy || fullEvery-period/2 <= period:
		return CadenceFast
	case g.shared && g.frozen:
		return CadenceFrozen
	case g.shared && g.mps:
		return CadenceMPS
	case g.shared:
		return CadenceFast
	case fast:
		return CadenceProbe
	}
	return CadenceSlow
}
