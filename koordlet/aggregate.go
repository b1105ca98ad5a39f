package koordlet

import (
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/collect"
)

// aggregate samples one cgroup that holds many pods (kubepods, kubelet's BestEffort
// QoS cgroup): one read per period instead of one per pod.
type aggregate struct {
	path   string
	reader *cgroups.UsageReader
	rate   collect.Rate
}

// read returns the cgroup's usage in cores over the last period; false when it cannot
// be read (or on the first sample). A cgroup that is missing is looked for again next
// period.
func (g *aggregate) read(h *cgroups.Hierarchy, now time.Time) (float64, bool) {
	if g.reader == nil {
		cg, err := h.Load(g.path)
		if err != nil {
			return 0, false
		}
		r, err := cg.UsageReader()
		if err != nil {
			return 0, false
		}
		g.reader, g.rate = r, collect.Rate{}
	}
	v, err := g.reader.Read()
	if err != nil {
		g.close()
		return 0, false
	}
	return g.rate.Update(now, v)
}

func (g *aggregate) close() {
	if g.reader != nil {
		_ = g.reader.Close()
		g.reader = nil
	}
}
