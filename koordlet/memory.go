package koordlet

import (
	"fmt"
	"math"
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/collect"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// MemoryUsage is the node's memory by class, in bytes: the working sets (usage minus
// inactive page cache, as kubelet counts them) of kubelet's aggregates and of the pods
// that do not sit where kubelet put them.
type MemoryUsage struct {
	// Capacity is the memory pods may use: kubepods' memory limit (kubelet sets it to
	// the node's allocatable) when there is one below MemTotal, else MemTotal.
	Capacity float64 `json:"capacity"`
	// Used is what counts against Capacity: kubepods' working set when Capacity is
	// kubepods' limit, else what the node uses (MemTotal − MemAvailable).
	Used  float64 `json:"used"`
	LS    float64 `json:"ls"`
	BE    float64 `json:"be"`
	Batch float64 `json:"batch"`
	// System is what runs outside pods within Capacity: MemTotal − MemAvailable −
	// kubepods, or 0 when Capacity is kubepods' limit (the system lives outside it).
	System float64 `json:"system"`
	// LSRequests is the sum of the LS pods' memory requests.
	LSRequests float64 `json:"lsRequests"`
}

// memoryReader samples the memory figures: the aggregates (kubepods, kubelet's
// BestEffort cgroup, the tier) every memoryEvery periods, the batch pods and the pods
// whose class does not match where kubelet put them on the slow periods.
type memoryReader struct {
	kubepodsLimit float64 // bytes; 0 none; read on slow periods
	last          MemoryUsage
	ok            bool
	at            time.Time // when last was read
	// The aggregates' groups, loaded once and again after an error, and their memory
	// readers (files kept open).
	kubepods, besteffort, tier          *cgroups.Group
	kubepodsMem, besteffortMem, tierMem *cgroups.MemoryReader
	// From the last slow period: the memory of LS pods in kubelet's BestEffort cgroup,
	// of the other pods outside it, and of in-place batch pods (in BestEffort, and all).
	lsInBE, otherOutBE, inPlaceInBE, inPlace float64
}

// memoryEvery is how many control periods pass between two memory samples. Memory is
// measured from three aggregates and /proc/meminfo; every half second (at the default
// period) keeps the tier limit close behind LS memory growth while the agent stays
// within 1 % of a core with 110 pods (every other period cost 0.4 % more).
const memoryEvery = 5

// readMemory samples the node's memory into s.mem (last, ok, at). When the node's
// memory cannot be read the last figures stay; a missing memory controller only leaves
// the per-class figures at 0.
func (s *sampler) readMemory(pods []*podState, lsMemRequests float64, slow bool, now time.Time) {
	r := &s.mem
	info, err := collect.ReadMemInfo(s.procRoot)
	if err != nil {
		s.metrics.Errors.WithLabelValues(metrics.ErrKindProcRead).Inc()
		s.log.Error("reading node memory; keeping the last memory figures", "err", err)
		return
	}
	if slow || !r.ok {
		r.kubepodsLimit = 0
		if g := s.loadOnce(&r.kubepods, s.layout.kubepods()); g != nil {
			if max, _, err := g.MemoryLimit(); err == nil && max > 0 && uint64(max) < info.Total {
				r.kubepodsLimit = float64(max)
			}
		}
		s.podMemory(pods)
	}
	nodeUsed := float64(info.Total - min(info.Available, info.Total))
	m := MemoryUsage{Capacity: float64(info.Total), Used: nodeUsed}
	kubepods, kpErr := s.groupMemory(&r.kubepods, &r.kubepodsMem, s.layout.kubepods())
	be, beErr := s.groupMemory(&r.besteffort, &r.besteffortMem, s.besteffort.path)
	tier, tierErr := s.groupMemory(&r.tier, &r.tierMem, s.layout.tier)
	if kpErr == nil && beErr == nil && tierErr == nil {
		tierOutsideBE := tier
		if s.tierInBE {
			tierOutsideBE = 0
		}
		m.LS = math.Max(0, kubepods-be-tierOutsideBE-r.otherOutBE+r.lsInBE)
		m.BE = math.Max(0, be-r.lsInBE-r.inPlaceInBE-(tier-tierOutsideBE))
		m.Batch = tier + r.inPlace
		m.System = math.Max(0, nodeUsed-kubepods)
		if r.kubepodsLimit > 0 {
			m.Capacity, m.Used, m.System = r.kubepodsLimit, kubepods, 0
		}
	} else {
		// No memory controller for kubelet's cgroups: everything used counts as LS, the
		// safe side (batch memory is then computed from the node's use alone).
		m.LS = m.Used
	}
	m.LSRequests = lsMemRequests
	r.last, r.ok, r.at = m, true, now
}

// loadOnce returns *g, loading rel into it first when it is not loaded; nil when rel
// cannot be loaded (tried again next time).
func (s *sampler) loadOnce(g **cgroups.Group, rel string) *cgroups.Group {
	if *g == nil {
		*g, _ = s.hier.Load(rel)
	}
	return *g
}

// groupMemory is one aggregate's working set in bytes, read through *mr; an error drops
// the loaded group and its reader, so both are opened again next time.
func (s *sampler) groupMemory(g **cgroups.Group, mr **cgroups.MemoryReader, rel string) (float64, error) {
	if *mr == nil {
		if s.loadOnce(g, rel) == nil {
			return 0, fmt.Errorf("loading %s: %w", rel, cgroups.ErrNotExist)
		}
		r, err := (*g).MemoryReader()
		if err != nil {
			*g = nil
			return 0, err
		}
		*mr = r
	}
	v, err := (*mr).Read()
	if err != nil {
		_ = (*mr).Close()
		*g, *mr = nil, nil
		return 0, err
	}
	return float64(v), nil
}

// close releases the aggregates' open memory files.
func (r *memoryReader) close() {
	for _, mr := range []**cgroups.MemoryReader{&r.kubepodsMem, &r.besteffortMem, &r.tierMem} {
		if *mr != nil {
			_ = (*mr).Close()
			*mr = nil
		}
	}
}

// podMemory samples the working set of the pods the aggregates cannot attribute, on slow
// periods: batch pods (eviction candidates, the batch total) and pods of a class other
// than the one kubelet's cgroup implies.
func (s *sampler) podMemory(pods []*podState) {
	r := &s.mem
	r.lsInBE, r.otherOutBE, r.inPlaceInBE, r.inPlace = 0, 0, 0, 0
	for _, st := range pods {
		mismatched := st.mismatched()
		if st.read.group == nil || (st.class != qos.ClassBatch && !mismatched) {
			continue
		}
		if st.read.memReader == nil {
			r, err := st.read.group.MemoryReader()
			if err != nil {
				continue // no memory controller, or the pod just went
			}
			st.read.memReader = r
		}
		v, err := st.read.memReader.Read()
		if err != nil {
			_ = st.read.memReader.Close() // opened again next time, if the pod is still there
			st.read.memReader = nil
			continue
		}
		st.read.memUsage = float64(v)
		switch {
		case st.class == qos.ClassBatch && st.read.inTier:
		case st.class == qos.ClassBatch:
			r.inPlace += st.read.memUsage
			if st.kubeQOS == cgroups.QOSBestEffort {
				r.inPlaceInBE += st.read.memUsage
			} else {
				r.otherOutBE += st.read.memUsage
			}
		case st.class == qos.ClassLS:
			r.lsInBE += st.read.memUsage
		default:
			r.otherOutBE += st.read.memUsage
		}
	}
}
