package koordlet

import (
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/collect"
)

// aggregate samples one cgroup that holds many pods (kubepods, kubelet's BestEffort
// QoS cgroup, the batch tier): one read per period instead of one per pod. It keeps the
// usage file open and reopens it after an error.
type aggregate struct {
	path   string
	reader *cgroups.UsageReader
	rate   collect.Rate
}

// read returns the cgroup's usage in cores over the last period. ok is false on the
// first sample after (re)opening and on any error; err is why the cgroup could not be
// opened or read (wrapping cgroups.ErrNotExist when it is gone). The file is opened
// again next period.
func (g *aggregate) read(h *cgroups.Hierarchy, now time.Time) (cores float64, ok bool, err error) {
	if g.reader == nil {
		cg, err := h.Load(g.path)
		if err != nil {
			return 0, false, err
		}
		if g.reader, err = cg.UsageReader(); err != nil {
			return 0, false, err
		}
		g.rate.Reset()
	}
	v, err := g.reader.Read()
	if err != nil {
		g.close()
		return 0, false, err
	}
	cores, ok = g.rate.Update(now, v)
	return cores, ok, nil
}

// opened reports whether the usage file is open (a read that opens it starts over).
func (g *aggregate) opened() bool { return g.reader != nil }

func (g *aggregate) close() {
	if g.reader != nil {
		_ = g.reader.Close()
		g.reader = nil
	}
}
